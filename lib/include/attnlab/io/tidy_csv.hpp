// Tidy (long) CSV results: one row per (identifying columns..., metric, value), the schema version and the
// code version leading every row. A path ending in ".gz" is gzip-compressed (pandas reads it as is): tidy rows
// repeat their identifying columns, and compress ~15×. Rows reach the file at every commit(), so an interrupted
// run keeps every committed row (a gzip stream cut short is read up to its last flush).
#pragma once

#include <string>
#include <vector>

namespace attnlab {

/// Version of the results schema; plot scripts assert it.
constexpr int kResultsSchemaVersion = 2;

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
  /// ±inf as "inf"/"-inf"; NaN is refused). Plain files are flushed at every row, gzip files at commit().
  void write(const std::vector<std::string>& keys, const std::string& metric, double value);
  /// Makes every row written so far readable by another process even if this one is killed next (a gzip
  /// sync flush; costs a few bytes, so call it per batch of rows, e.g. per sweep point).
  void commit();
  /// Closes the file (also done by the destructor); throws Error when the last write fails.
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> columns_;
  void* f_ = nullptr;  // gzFile: zlib writes plain files too ("T" mode), so one code path serves both
};

/// True when `path` names a gzip file (ends in ".gz").
bool is_gzip_path(const std::string& path);

/// The text of a plain or gzip file. A gzip stream cut short (an interrupted writer) is read up to its last
/// complete flush; a missing, unreadable or corrupt file is an Error.
std::string read_text_file(const std::string& path);

/// Writes `text` to `path` atomically (a temporary file, then rename), gzip-compressed at level 9 when the path
/// ends in ".gz". The same text gives the same bytes (the gzip header carries no time stamp).
void write_text_file(const std::string& path, const std::string& text);

/// The header line of a tidy CSV with these identifying columns (without the newline).
std::string tidy_header(const std::vector<std::string>& columns);

/// Quotes a CSV field when it holds a comma, a quote or a newline.
std::string csv_field(const std::string& s);

/// Splits one CSV line into its fields, csv_field's quoting undone (a quoted field may hold commas and "" quotes).
std::vector<std::string> split_csv_line(const std::string& line);

}  // namespace attnlab
