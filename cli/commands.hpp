// Subcommands of the attnlab command; each registers itself on the app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace attnlab::cli {

/// The command line as typed, for result sidecars (set once by main).
void set_command_line(int argc, char** argv);
const std::string& command_line();

/// Validator: a finite number > 0 (CLI11 would let "nan" and "inf" through).
CLI::Validator positive_finite();
/// --q, --k, --v (.npy), each requiring the other two; returns --q (for excludes). q_help describes --q's shapes.
CLI::Option* add_qkv_files(CLI::App* sub, std::string& q, std::string& k, std::string& v, const std::string& q_help);

void add_apply(CLI::App& app);
void add_compare(CLI::App& app);
void add_methods(CLI::App& app);
/// The README's methods table, from the registry.
std::string methods_markdown();
void add_report(CLI::App& app);

}  // namespace attnlab::cli
