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

std::string ModelHead::label() const { return file ? fmt::format("head{}", head) : fmt::format("L{}H{}", layer, head); }

std::shared_ptr<const UserFiles> UserFiles::read(const FileOptions& files, const std::string& experiment, bool need_v) {
  require(!files.k.empty() && (!need_v || !files.v.empty()),
          fmt::format("{}: --q needs --k{}", experiment, need_v ? " and --v" : ""));
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

ModelData::ModelData(const std::string& dir, const std::string& model, const std::string& name)
    : dir_(dir), model_(model), name_(name.empty() ? model : name) {
  // An export holds trained/ and initialized/ (tools/trained_attention.py) or captured/ (attnlab.torch.capture).
  require(is_model_source(model) || model == "captured",
          fmt::format("model export part '{}' is none of 'trained', 'initialized', 'captured'", model));
  const std::string make = fmt::format("make it with `tools/trained_attention.py{} --out {}` (or point --model-data / "
                                       "ATTNLAB_MODEL_DATA at an export)",
                                       name_ == "trained_causal" ? " --objective causal" : "", dir);
  // meta.json is written last: without it the export is missing or was interrupted.
  std::ifstream meta(dir + "/meta.json");
  require(bool(meta), fmt::format("source '{}': no exported attention in {} (no meta.json); {}", name_, dir, make));
  std::stringstream text;
  text << meta.rdbuf();
  const std::string json = text.str();
  std::smatch m;
  require(std::regex_search(json, m, std::regex("\"key\"\\s*:\\s*\"([0-9a-f]+)\"")),
          fmt::format("{}/meta.json has no \"key\"; {}", dir, make));
  key_ = m[1];
  require(std::regex_search(json, m, std::regex("\"bidirectional\"\\s*:\\s*(true|false)")),
          fmt::format("{}/meta.json has no \"bidirectional\"; {}", dir, make));
  bidirectional_ = m[1] == "true";

  while (fs::exists(file(0, layers_, "q"))) ++layers_;
  while (fs::exists(file(sequences_, 0, "q"))) ++sequences_;
  require(layers_ > 0 && sequences_ > 0, fmt::format("source '{}': no {} in {}; {}", model, "seq0_layer0_q.npy",
                                                     dir + "/" + model, make));
  const NpyArray q = NpyArray::read(file(0, 0, "q"));
  require(q.ndim() == 3, fmt::format("{}: expected (heads, n, d_head), got {} dimensions", q.path(), q.ndim()));
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
            fmt::format("--model-heads: '{}' is not LAYER:HEAD (or 'all', 'diagonal')", s));
    const Index l = std::stol(m[1]), h = std::stol(m[2]);
    require(l < layers_ && h < heads_, fmt::format("--model-heads: {} is out of range; the {} model has {} layers x "
                                                   "{} heads", s, name_, layers_, heads_));
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
            fmt::format("{}: shape differs from seq0_layer0_q.npy ({}, {}, {})", a.path(), heads_, n_, d_));
    *dst[i] = a.head_as<double>(h.head);
  }
  return p;
}

bool ModelData::has_upstream(const ModelHead& h) const { return !files_ && fs::exists(file(h.seq, h.layer, "do")); }

MatrixR<double> ModelData::upstream(const ModelHead& h) const {
  require(has_upstream(h), fmt::format("{}: no upstream gradient in this export (re-export with a current "
                                       "tools/trained_attention.py, which writes seq{{s}}_layer{{l}}_do.npy)",
                                       files_ ? std::string("the user's files") : file(h.seq, h.layer, "do")));
  const NpyArray a = NpyArray::read(file(h.seq, h.layer, "do"));
  a.check_finite();
  require(a.ndim() == 3 && a.heads() == heads_ && a.rows() == n_ && a.cols() == d_,
          fmt::format("{}: expected ({}, {}, {})", a.path(), heads_, n_, d_));
  return a.head_as<double>(h.head);
}

MatrixR<double> ModelData::model_attention(Index layer, Index head) const {
  if (files_) return {};
  const std::string path = file(0, layer, "attn");
  if (!fs::exists(path)) return {};
  const NpyArray a = NpyArray::read(path);
  require(a.ndim() == 3 && a.heads() == heads_ && a.rows() == n_ && a.cols() == n_,
          fmt::format("{}: expected ({}, {}, {})", path, heads_, n_, n_));
  return a.head_as<double>(head);
}

}  // namespace attnlab
