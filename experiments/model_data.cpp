#include "model_data.hpp"

#include "attnlab/error.hpp"
#include "attnlab/npy.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace attnlab::experiments {
namespace fs = std::filesystem;

std::string ModelHead::label() const { return fmt::format("L{}H{}", layer, head); }

std::string ModelData::default_dir() {
  const char* env = std::getenv("ATTNLAB_MODEL_DATA");
  return env && *env ? env : "data/attention";
}

std::string ModelData::file(Index seq, Index layer, const char* what) const {
  return fmt::format("{}/{}/seq{}_layer{}_{}.npy", dir_, model_, seq, layer, what);
}

ModelData::ModelData(const std::string& dir, const std::string& model) : dir_(dir), model_(model) {
  require(is_model_source(model), fmt::format("model source '{}' is neither 'trained' nor 'initialized'", model));
  const std::string make = fmt::format("make it with `tools/trained_attention.py --out {}` (or point --model-data / "
                                       "ATTNLAB_MODEL_DATA at an export)", dir);
  // meta.json is written last: without it the export is missing or was interrupted.
  std::ifstream meta(dir + "/meta.json");
  require(bool(meta), fmt::format("source '{}': no exported attention in {} (no meta.json); {}", model, dir, make));
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

std::vector<ModelHead> ModelData::select(const std::vector<std::string>& spec, Index max_seqs) const {
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
                                                   "{} heads", s, model_, layers_, heads_));
    chosen.insert({l, h});
  }
  const Index seqs = max_seqs > 0 ? std::min(max_seqs, sequences_) : sequences_;
  std::vector<ModelHead> out;
  for (Index s = 0; s < seqs; ++s)
    for (const auto& [l, h] : chosen) out.push_back({s, l, h});
  return out;
}

std::string ModelData::point_id(const ModelHead& h) const {
  return fmt::format("source={} key={} seq={} {}", model_, key_, h.seq, h.label());
}

Qkv<double> ModelData::load(const ModelHead& h) const {
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

MatrixR<double> ModelData::model_attention(Index layer, Index head) const {
  const std::string path = file(0, layer, "attn");
  if (!fs::exists(path)) return {};
  const NpyArray a = NpyArray::read(path);
  require(a.ndim() == 3 && a.heads() == heads_ && a.rows() == n_ && a.cols() == n_,
          fmt::format("{}: expected ({}, {}, {})", path, heads_, n_, n_));
  return a.head_as<double>(head);
}

void ModelOptions::declare(Options& o, std::vector<std::string> heads_quick, std::vector<std::string> heads_paper,
                           Index seqs_quick, Index seqs_paper) {
  o.add("--model-data", dir, "directory of tools/trained_attention.py's export (sources trained, initialized)");
  o.add("--model-heads", heads, "heads of the model sources: all, diagonal (one per layer), or LAYER:HEAD,...")
      .preset(std::move(heads_quick), std::move(heads_paper));
  o.add("--model-seqs", seqs, "held-out sequences of the model sources (0: all)").preset(seqs_quick, seqs_paper);
}

std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>> ModelOptions::open(const std::string& source) const {
  auto data = std::make_shared<const ModelData>(dir, source);
  return {data, data->select(heads, seqs)};
}

std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>> ModelOptions::open_bidirectional(
    const std::string& source, const std::string& experiment) const {
  auto opened = open(source);
  require(opened.first->bidirectional(),
          fmt::format("{}: the {} model in {} is causal; this experiment runs non-causal methods on it — export a "
                      "bidirectional one (tools/trained_attention.py --objective mlm)", experiment, source, dir));
  return opened;
}

}  // namespace attnlab::experiments
