// Tidy CSV writer.
#include "attnlab/tidy_csv.hpp"

#include "attnlab/error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace attnlab {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string tidy_header(const std::vector<std::string>& columns) {
  std::string header = "schema_version,code_version";
  for (const auto& c : columns) header += "," + c;
  return header + ",metric,value";
}

TidyCsvWriter::TidyCsvWriter(const std::string& path, std::vector<std::string> columns, bool append)
    : path_(path), columns_(std::move(columns)) {
  const std::string header = tidy_header(columns_);
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    if (ec) throw Error(fmt::format("{}: cannot create directory: {}", path, ec.message()));
  }
  bool write_header = true;
  if (append && fs::exists(p) && fs::file_size(p) > 0) {
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    if (first != header)
      throw Error(fmt::format("{}: exists with other columns; cannot append (header '{}')", path, first));
    write_header = false;
  }
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) throw Error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  if (write_header) {
    std::fputs((header + "\n").c_str(), f_);
    std::fflush(f_);
  }
}

TidyCsvWriter::~TidyCsvWriter() {
  if (f_) std::fclose(f_);
}

void TidyCsvWriter::write(const std::vector<std::string>& keys, const std::string& metric, double value) {
  require(keys.size() == columns_.size(),
          fmt::format("{}: row has {} keys for {} columns", path_, keys.size(), columns_.size()));
  require(!std::isnan(value), fmt::format("{}: refusing to write NaN for metric '{}'", path_, metric));
  std::string line = fmt::format("{},{}", kResultsSchemaVersion, code_version());
  for (const auto& k : keys) line += "," + csv_field(k);
  line += "," + csv_field(metric) + ",";
  line += std::isinf(value) ? (value > 0 ? "inf" : "-inf") : fmt::format("{}", value);
  line += "\n";
  if (std::fputs(line.c_str(), f_) < 0 || std::fflush(f_) != 0)
    throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
}

}  // namespace attnlab
