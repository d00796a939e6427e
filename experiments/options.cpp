// The CLI11 side of the experiments' option declarations (options.hpp): registering a flag instantiates CLI11's
// templates for its type, done here once for every type an experiment declares.
#include "options.hpp"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace attnlab::experiments {

template <typename V>
void add_flag(CLI::App& app, const std::string& flag, V& target, const std::string& help, char separator) {
  CLI::Option* opt = app.add_option(flag, target, help);
  if constexpr (is_vector<V>::value) opt->delimiter(separator);
}

template void add_flag(CLI::App&, const std::string&, int&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, long&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, unsigned long&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, double&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, bool&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, std::string&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, std::vector<long>&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, std::vector<double>&, const std::string&, char);
template void add_flag(CLI::App&, const std::string&, std::vector<std::string>&, const std::string&, char);

}  // namespace attnlab::experiments
