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
                             "trained_causal reads DIR_causal, the causal model's export)");
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
    for (std::string kinds = std::string(source_kinds()) + ", trained, initialized, trained_causal, files";
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
  auto data = source == "trained_causal" ? std::make_shared<const ModelData>(dir + "_causal", "trained", source)
                                         : std::make_shared<const ModelData>(dir, source);
  return {data, data->select(heads, seqs)};
}

std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>> ModelOptions::open_bidirectional(
    const std::string& source, const std::string& experiment) const {
  auto opened = open(source);
  require(opened.first->bidirectional(),
          fmt::format("{}: the {} model in {} is causal; this experiment runs non-causal methods on it — export a "
                      "bidirectional one (tools/trained_attention.py --objective mlm)", experiment, source,
                      source == "trained_causal" ? dir + "_causal" : dir));
  return opened;
}

}  // namespace attnlab::experiments
