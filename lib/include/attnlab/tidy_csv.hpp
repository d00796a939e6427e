// Tidy (long) CSV results: one row per (identifying columns..., metric, value), the schema version and the
// code version leading every row. Rows are flushed as they are written, so an interrupted run keeps them.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace attnlab {

/// Version of the results schema; plot scripts assert it.
constexpr int kResultsSchemaVersion = 1;

class TidyCsvWriter {
 public:
  /// Opens `path` (creating its directory). `columns` are the identifying columns between the leading
  /// schema_version, code_version and the trailing metric, value. With append = true and an existing file
  /// whose header matches, rows are appended; a mismatching header is an Error.
  TidyCsvWriter(const std::string& path, std::vector<std::string> columns, bool append = false);
  ~TidyCsvWriter();
  TidyCsvWriter(const TidyCsvWriter&) = delete;
  TidyCsvWriter& operator=(const TidyCsvWriter&) = delete;

  /// Writes one row: `keys` in the order of the columns, then metric and value (shortest round-trip form;
  /// ±inf as "inf"/"-inf"; NaN is refused).
  void write(const std::vector<std::string>& keys, const std::string& metric, double value);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> columns_;
  std::FILE* f_ = nullptr;
};

/// The header line of a tidy CSV with these identifying columns (without the newline).
std::string tidy_header(const std::vector<std::string>& columns);

/// Quotes a CSV field when it holds a comma, a quote or a newline.
std::string csv_field(const std::string& s);

}  // namespace attnlab
