// Subcommands of the attnlab command; each registers itself on the app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace attnlab {
template <typename T>
class Method;
}

namespace attnlab::cli {

/// The command line as typed, for result sidecars (set once by main).
void set_command_line(int argc, char** argv);
const std::string& command_line();

/// Validator: a finite number > 0 (CLI11 would let "nan" and "inf" through).
CLI::Validator positive_finite();
/// --q, --k, --v (.npy), each requiring the other two; returns --q (for excludes). q_help describes --q's shapes.
CLI::Option* add_qkv_files(CLI::App* sub, std::string& q, std::string& k, std::string& v, const std::string& q_help);

/// --precision, --policy and --fail-on-nonfinite: a command's emulated storage (apply, compare).
struct PrecisionOptions {
  std::string precision;  // "" (the dtype's native path), fp64, fp32, bf16, fp16
  std::string policy = "eager";
  bool fail_on_nonfinite = false;
};
/// Registers the three options on `sub`; `what` says what --precision's run reports (its help's tail).
void add_precision_options(CLI::App* sub, PrecisionOptions& o, const std::string& what);
/// The compute dtype the options imply: --precision fp64 → "f64", bf16/fp16/fp32 → "f32" (the emulation's float32
/// accumulation), refused where --dtype says otherwise; `dtype` as given without --precision. Then every method (its
/// parameters too: Method::check_storage_support) is checked for the storage and policy, before any work.
std::string precision_dtype(const PrecisionOptions& o, const std::string& dtype,
                            const std::vector<const Method<double>*>& methods);
/// --policy careful and --fail-on-nonfinite act under bf16/fp16 only (fp32 and fp64 round nothing): refused where the
/// run's precision (`o.precision`, as given or as float16 files imply it) is not one of them, so that neither option
/// is silently without effect.
void require_reduced_for_policy(const PrecisionOptions& o);

void add_apply(CLI::App& app);
void add_compare(CLI::App& app);
void add_methods(CLI::App& app);
/// The README's methods table, from the registry.
std::string methods_markdown();
void add_report(CLI::App& app);

}  // namespace attnlab::cli
