#include "attnlab/io/model_export.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/io/npy.hpp"
#include "attnlab/core/spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace attnlab {

namespace fs = std::filesystem;

namespace {

// The values of "name" in a JSON text, at any depth, in order, as written: a string with its quotes, else the literal
// (a number, true, false, null; the start of an object or array). Enough for meta.json's flat fields.
std::vector<std::string> json_values(const std::string& json, const std::string& name) {
  const std::regex re("\"" + name + "\"\\s*:\\s*(\"(?:[^\"\\\\]|\\\\.)*\"|[^,}\\]\\s]+)");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

// A value as a message quotes it: at most 40 characters.
std::string shown(const std::string& value) { return value.size() <= 40 ? value : value.substr(0, 37) + "..."; }

// "name": true|false in a JSON text (the first boolean among its values): nullopt when absent; throws Error naming
// `where` when present with no boolean value, the message ending with `hint`.
std::optional<bool> json_bool(const std::string& json, const std::string& name, const std::string& where,
                              const std::string& hint) {
  const std::vector<std::string> values = json_values(json, name);
  for (const std::string& v : values)
    if (v == "true" || v == "false") return v == "true";
  if (!values.empty())
    throw Error(fmt::format("{}: \"{}\" is {}, not true or false (a JSON boolean{}){}", where, name,
                            shown(values.front()), name == "causal" ? "" : ": false for a causal model",
                            hint.empty() ? "" : "; " + hint));
  return std::nullopt;
}

}  // namespace

MaskStatement mask_statement(const std::string& npy_path) {
  const fs::path file(npy_path), dir = file.parent_path();
  std::vector<fs::path> sidecars = {fs::path(npy_path + ".json"), dir / "meta.json"};
  const std::string part = fs::path(dir).filename().string();
  if (part == "captured" || part == "trained" || part == "initialized")
    sidecars.push_back(dir.parent_path() / "meta.json");
  for (const fs::path& p : sidecars) {
    std::ifstream in(p);
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    const std::string json = text.str(), where = p.string();
    const std::optional<bool> causal = json_bool(json, "causal", where, ""),
                              bidirectional = json_bool(json, "bidirectional", where, "");
    if (causal && bidirectional && *causal == *bidirectional)
      throw Error(fmt::format("{}: \"causal\": {} and \"bidirectional\": {} disagree", where, *causal,
                              *bidirectional));
    if (causal) return {causal, where};
    if (bidirectional) return {!*bidirectional, where};
  }
  return {};
}

std::string ModelHead::label() const { return file ? fmt::format("head{}", head) : fmt::format("L{}H{}", layer, head); }

std::shared_ptr<const UserFiles> UserFiles::read(const FileOptions& files, const std::string& experiment, bool need_v) {
  require(!files.k.empty() && (!need_v || !files.v.empty()),
          "{}: --q needs --k{}", experiment, need_v ? " and --v" : "");
  auto f = std::make_shared<UserFiles>(UserFiles{NpyArray::read(files.q), NpyArray::read(files.k), std::nullopt});
  if (!files.v.empty()) f->v = NpyArray::read(files.v);
  check_qkv_arrays(f->q, f->k, f->v ? &*f->v : nullptr, experiment + ": ");
  return f;
}

std::string ModelData::default_dir() {
  const char* env = std::getenv("ATTNLAB_MODEL_DATA");
  return env && *env ? env : "data/attention";
}

std::string ModelData::file(Index seq, Index layer, const char* what) const {
  return fmt::format("{}/{}/seq{}_layer{}_{}.npy", dir_, model_, seq, layer, what);
}

std::string ModelData::layout(const std::string& dir, const std::string& model) {
  return fmt::format("a valid export is {0}/meta.json, a JSON object with \"key\": \"<lowercase hex>\" and "
                     "\"bidirectional\": true|false, written last, beside {0}/{1}/seq{{s}}_layer{{l}}_{{q,k,v}}.npy, "
                     "(heads, n, d_head) per sequence s and layer l, from 0",
                     dir, model);
}

ModelData::ModelData(const std::string& dir, const std::string& model, const std::string& name,
                     const std::string& make)
    : dir_(dir), model_(model), name_(name.empty() ? model : name) {
  // An export holds trained/ and initialized/ (tools/trained_attention.py) or captured/ (attnlab.torch.capture).
  require(model == "trained" || model == "initialized" || model == "captured",
          "model export part '{}' is none of 'trained', 'initialized', 'captured'", model);
  const std::string hint =
      layout(dir, model) + "; " +
      (make.empty() ? fmt::format("make it with `tools/trained_attention.py{} --out {}` (or point --model-data / "
                                  "ATTNLAB_MODEL_DATA at an export)",
                                  name_ == "trained_causal" ? " --objective causal" : "", dir)
                    : make);
  // meta.json is written last: without it the export is missing or was interrupted.
  std::ifstream meta(dir + "/meta.json");
  require(bool(meta), "source '{}': no exported attention in {} (no meta.json); {}", name_, dir, hint);
  std::stringstream text;
  text << meta.rdbuf();
  const std::string json = text.str(), where = dir + "/meta.json";
  // "key": the first lowercase-hex string among its values (at any depth, as before).
  const std::vector<std::string> keys = json_values(json, "key");
  const std::regex lower_hex("\"[0-9a-f]+\"");
  const auto hex = std::find_if(keys.begin(), keys.end(),
                                [&](const std::string& k) { return std::regex_match(k, lower_hex); });
  require(!keys.empty(), "{} has no \"key\" (a string of lowercase hex digits naming the data, e.g. a "
                         "hash of the arrays); {}", where, hint);
  if (hex == keys.end())
    throw Error(fmt::format("{}: \"key\" is {}, not a string of lowercase hex digits ([0-9a-f]+, e.g. a hash of the "
                            "arrays); {}", where, shown(keys.front()), hint));
  key_ = hex->substr(1, hex->size() - 2);
  const std::optional<bool> bidirectional = json_bool(json, "bidirectional", where, hint);
  require(bidirectional.has_value(), "{} has no \"bidirectional\" (true, or false for a causal model); {}",
                                     where, hint);
  bidirectional_ = *bidirectional;

  while (fs::exists(file(0, layers_, "q"))) ++layers_;
  while (fs::exists(file(sequences_, 0, "q"))) ++sequences_;
  require(layers_ > 0 && sequences_ > 0, "source '{}': no {} in {}; {}", model, "seq0_layer0_q.npy",
                                         dir + "/" + model, hint);
  const NpyArray q = NpyArray::read(file(0, 0, "q"));
  require(q.ndim() == 3, "{}: expected (heads, n, d_head), got {} dimensions", q.path(), q.ndim());
  heads_ = q.heads();
  n_ = q.rows();
  d_ = q.cols();
}

ModelData::ModelData(std::shared_ptr<const UserFiles> files)
    : files_(std::move(files)), model_("files"), name_("files") {
  sequences_ = 1;
  layers_ = 1;
  heads_ = files_->q.heads();
  n_ = files_->q.rows();
  d_ = files_->q.cols();
}

std::vector<ModelHead> ModelData::select(const std::vector<std::string>& spec, Index max_seqs) const {
  if (files_) {  // the user's files: every head (--model-heads chooses among a model's layers and heads)
    std::vector<ModelHead> out;
    for (Index h = 0; h < heads_; ++h) out.push_back({0, 0, h, true});
    return out;
  }
  std::set<std::pair<Index, Index>> chosen;
  for (const std::string& s : spec) {
    if (s == "all") {
      for (Index l = 0; l < layers_; ++l)
        for (Index h = 0; h < heads_; ++h) chosen.insert({l, h});
      continue;
    }
    if (s == "diagonal") {  // one head per layer: (l, l mod heads)
      for (Index l = 0; l < layers_; ++l) chosen.insert({l, l % heads_});
      continue;
    }
    std::smatch m;
    require(std::regex_match(s, m, std::regex("(\\d+):(\\d+)")),
            "--model-heads: '{}' is not LAYER:HEAD (or 'all', 'diagonal')", s);
    const Index l = std::stol(m[1]), h = std::stol(m[2]);
    require(l < layers_ && h < heads_, "--model-heads: {} is out of range; the {} model has {} layers x "
                                       "{} heads", s, name_, layers_, heads_);
    chosen.insert({l, h});
  }
  const Index seqs = max_seqs > 0 ? std::min(max_seqs, sequences_) : sequences_;
  std::vector<ModelHead> out;
  for (Index s = 0; s < seqs; ++s)
    for (const auto& [l, h] : chosen) out.push_back({s, l, h});
  return out;
}

std::string ModelData::point_id(const ModelHead& h) const {
  if (files_)
    return fmt::format("source=files q={} k={} v={} head={}", files_->q.path(), files_->k.path(),
                       files_->v ? files_->v->path() : "", h.head);
  return fmt::format("source={} key={} seq={} {}", name_, key_, h.seq, h.label());
}

Qkv<double> ModelData::load(const ModelHead& h) const {
  if (files_) {
    require(bool(files_->v), "source 'files': this experiment needs the values too: give --v");
    return {files_->q.head_as<double>(h.head), files_->k.head_as<double>(h.head), files_->v->head_as<double>(h.head)};
  }
  Qkv<double> p;
  MatrixR<double>* dst[3] = {&p.q, &p.k, &p.v};
  const char* what[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const NpyArray a = NpyArray::read(file(h.seq, h.layer, what[i]));
    a.check_finite();
    require(a.ndim() == 3 && a.heads() == heads_ && a.rows() == n_ && a.cols() == d_,
            "{}: shape differs from seq0_layer0_q.npy ({}, {}, {})", a.path(), heads_, n_, d_);
    *dst[i] = a.head_as<double>(h.head);
  }
  return p;
}

MaskStatement ModelData::mask() const {
  if (files_) return {};
  return {!bidirectional_, dir_ + "/meta.json"};
}

bool ModelData::has_upstream(const ModelHead& h) const { return !files_ && fs::exists(file(h.seq, h.layer, "do")); }

MatrixR<double> ModelData::upstream(const ModelHead& h) const {
  require(has_upstream(h), "{}: no upstream gradient in this export (re-export with a current {}, which "
                           "writes seq{{s}}_layer{{l}}_do.npy)",
                           files_ ? std::string("the user's files") : file(h.seq, h.layer, "do"),
                           name_ == "pretrained" ? "tools/pretrained.py --export"
                                                             : "tools/trained_attention.py");
  const NpyArray a = NpyArray::read(file(h.seq, h.layer, "do"));
  a.check_finite();
  require(a.ndim() == 3 && a.heads() == heads_ && a.rows() == n_ && a.cols() == d_,
          "{}: expected ({}, {}, {})", a.path(), heads_, n_, d_);
  return a.head_as<double>(h.head);
}

MatrixR<double> ModelData::model_attention(Index layer, Index head) const {
  if (files_) return {};
  const std::string path = file(0, layer, "attn");
  if (!fs::exists(path)) return {};
  const NpyArray a = NpyArray::read(path);
  require(a.ndim() == 3 && a.heads() == heads_ && a.rows() == n_ && a.cols() == n_,
          "{}: expected ({}, {}, {})", path, heads_, n_, n_);
  return a.head_as<double>(head);
}

}  // namespace attnlab
