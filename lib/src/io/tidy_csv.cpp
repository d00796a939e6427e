// Tidy CSV writer.
#include "attnlab/io/tidy_csv.hpp"

#include "attnlab/core/error.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace attnlab {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
      else if (c == '"') quoted = false;
      else out.back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  return out;
}

std::string tidy_header(const std::vector<std::string>& columns) {
  std::string header = "schema_version,code_version";
  for (const auto& c : columns) header += "," + c;
  return header + ",metric,value";
}

bool is_gzip_path(const std::string& path) {
  return path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
}

std::string read_text_file(const std::string& path) {
  gzFile g = gzopen(path.c_str(), "rb");  // reads plain files transparently
  if (!g) throw Error(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  gzbuffer(g, 1 << 17);
  std::string text;
  char buf[1 << 16];
  int got = 0;
  while ((got = gzread(g, buf, sizeof buf)) > 0) text.append(buf, std::size_t(got));
  int err = Z_OK;
  gzerror(g, &err);
  gzclose_r(g);
  // Z_BUF_ERROR: the stream ends before its trailer (a writer killed after a flush); what precedes is valid.
  if (got < 0 && err != Z_BUF_ERROR) throw Error(fmt::format("{}: corrupt gzip data", path));
  return text;
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".partial";
  gzFile g = gzopen(tmp.c_str(), is_gzip_path(path) ? "wb9" : "wbT");
  if (!g) throw Error(fmt::format("{}: cannot write: {}", tmp, std::strerror(errno)));
  const bool ok = text.empty() || gzwrite(g, text.data(), unsigned(text.size())) == int(text.size());
  if (gzclose_w(g) != Z_OK || !ok) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: write failed", path));
  }
  std::filesystem::rename(tmp, path);
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
    const std::string text = read_text_file(path);
    const std::string first = text.substr(0, text.find('\n'));
    if (first != header)
      throw Error(fmt::format("{}: exists with other columns; cannot append (header '{}')", path, first));
    write_header = false;
  }
  // Appending to a gzip file starts a new gzip member; readers (zlib, Python's gzip, pandas) join members.
  const char* mode = is_gzip_path(path) ? (append ? "ab6" : "wb6") : (append ? "abT" : "wbT");
  gzFile g = gzopen(path.c_str(), mode);
  if (!g) throw Error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  f_ = g;
  if (write_header) {
    gzputs(g, (header + "\n").c_str());
    commit();
  }
}

TidyCsvWriter::~TidyCsvWriter() {
  if (f_) gzclose_w(static_cast<gzFile>(f_));
}

void TidyCsvWriter::close() {
  if (!f_) return;
  const int rc = gzclose_w(static_cast<gzFile>(f_));
  f_ = nullptr;
  if (rc != Z_OK) throw Error(fmt::format("{}: write failed on close", path_));
}

void TidyCsvWriter::commit() {
  require(f_ != nullptr, "{}: written after close", path_);
  if (gzflush(static_cast<gzFile>(f_), Z_SYNC_FLUSH) != Z_OK)
    throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
}

void TidyCsvWriter::write(const std::vector<std::string>& keys, const std::string& metric, double value) {
  require(f_ != nullptr, "{}: written after close", path_);
  require(keys.size() == columns_.size(),
          "{}: row has {} keys for {} columns", path_, keys.size(), columns_.size());
  require(!std::isnan(value), "{}: refusing to write NaN for metric '{}'", path_, metric);
  std::string line = fmt::format("{},{}", kResultsSchemaVersion, code_version());
  for (const auto& k : keys) line += "," + csv_field(k);
  line += "," + csv_field(metric) + ",";
  line += std::isinf(value) ? (value > 0 ? "inf" : "-inf") : fmt::format("{}", value);
  line += "\n";
  if (gzwrite(static_cast<gzFile>(f_), line.data(), unsigned(line.size())) != int(line.size()))
    throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
  if (!is_gzip_path(path_)) commit();
}

}  // namespace attnlab
