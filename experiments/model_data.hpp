// The experiments' options for model sources (--model-data, --model-heads, --model-seqs, --q/--k/--v); the export
// itself is read by attnlab/io/model_export.hpp, whose header describes its layout (meta.json, the parts, the files).
// Real attention: the Q, K, V that tools/trained_attention.py exported from a small byte-level transformer trained on
// the Python standard library (source `trained`) and from the same model at initialisation (`initialized`), under DIR
// (default $ATTNLAB_MODEL_DATA, else data/attention); the causal model's in DIR_causal (`trained_causal`); a real
// pretrained model's, all-MiniLM-L6-v2 exported by tools/pretrained.py, in DIR/../pretrained (`pretrained`:
// data/pretrained) — and the user's own (source `files`: --q, --k, --v, (n, d) or (h, n, d) .npy, one point per
// head).
#pragma once

#include "attnlab/io/model_export.hpp"
#include "options.hpp"
#include "sweep.hpp"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attnlab::experiments {

using attnlab::FileOptions;
using attnlab::ModelData;
using attnlab::ModelHead;
using attnlab::UserFiles;

/// Where a model head's rows come from (results schema 2): source = the source's name (trained, initialized,
/// trained_causal, pretrained, files), sequence = the held-out sequence, layer, head; the user's files have heads
/// only (sequence and layer stay empty). The experiments seed a head's randomized methods with its sequence index:
/// that goes in the seed column (row_key's seed).
inline Row head_row(const ModelData& data, const ModelHead& h) {
  Row r;
  const std::string label = data.source_label(h);  // "NAME/L{l}H{h}", "files/head{h}"
  r.source = label.substr(0, label.size() - h.label().size() - 1);
  r.head = h.head;
  if (!h.file) r.sequence = h.seq, r.layer = h.layer;
  return r;
}

/// The options every experiment with model sources registers: --model-data, --model-heads, --model-seqs, and the
/// user's files --q, --k, --v. One rule for the sources (applied after the preset): giving --q makes `files` a
/// source — the only one unless --sources names others too; `--sources files` without --q is refused, and so is a
/// source no experiment knows.
struct ModelOptions {
  std::string dir = ModelData::default_dir();
  std::vector<std::string> heads = {"all"};
  Index seqs = 0;
  FileOptions files;
  /// Declares --model-data, --model-heads, --model-seqs, --q, --k and --v; heads and seqs take the presets' values
  /// given here (quick, paper; by default every head of every sequence under both). The experiment's --sources
  /// (declared by the experiment) follows the rule above.
  void declare(Options& o, std::vector<std::string> heads_quick = {"all"},
               std::vector<std::string> heads_paper = {"all"}, Index seqs_quick = 0, Index seqs_paper = 0);
  /// The selected heads of `source` ("trained", "initialized", "trained_causal", "pretrained" or "files"), with the
  /// data they come from.
  std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>> open(const std::string& source) const;
  /// Where source `pretrained` is read: the directory beside --model-data named pretrained (data/pretrained for
  /// data/attention), tools/pretrained.py's export of all-MiniLM-L6-v2.
  std::string pretrained_dir() const;
  /// The export directory a model source reads (DIR, DIR_causal, DIR/../pretrained).
  std::string source_dir(const std::string& source) const;
  /// As open(), but refuses a causal model's export: `experiment` runs non-causal methods (Nyström, Linformer,
  /// ...) on it, which would see the future.
  std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>> open_bidirectional(
      const std::string& source, const std::string& experiment) const;
  /// One grid point per selected head of a model source, opened as open_bidirectional() does: id data.point_id(h),
  /// rows evaluate(data, h) — the head's Q, K, V are loaded when the point runs, not when the grid is made.
  template <typename Evaluate>
  void add_head_points(std::vector<Point>& pts, const std::string& source, const std::string& experiment,
                       Evaluate evaluate) const {
    const auto [data, heads] = open_bidirectional(source, experiment);
    for (const ModelHead& h : heads)
      pts.push_back({data->point_id(h), [=, data = data] { return evaluate(*data, h); }});
  }
  /// As above, one point per selected head and budget value (landmarks, codes, ...) up to the head's length n:
  /// id "data.point_id(h) key=value", rows evaluate(data, h, value).
  template <typename Evaluate>
  void add_head_points(std::vector<Point>& pts, const std::string& source, const std::string& experiment,
                       const std::string& key, const std::vector<Index>& values, Evaluate evaluate) const {
    const auto [data, heads] = open_bidirectional(source, experiment);
    for (const ModelHead& h : heads)
      for (Index value : values) {
        if (value > data->n()) continue;
        pts.push_back({fmt::format("{} {}={}", data->point_id(h), key, value),
                       [=, data = data] { return evaluate(*data, h, value); }});
      }
  }
};

/// An experiment on generated problems and on the heads of the model sources alike (pinv, probsparse, regimes,
/// vq): its grid is one pass over --sources in their order, a model source giving its heads' points
/// (model_points: ModelOptions::add_head_points) and a generated one its settings' points, one per seed
/// (generated_points: add_seed_points).
class SourcesExperiment : public Experiment {
 public:
  std::vector<Point> grid() final {
    std::vector<Point> pts;
    for (const auto& src : sources_) {
      if (ModelData::is_model_source(src)) model_points(pts, src);
      else generated_points(pts, src);
    }
    return pts;
  }

 protected:
  /// Declares --seeds, then the model options with their presets (ModelOptions::declare): the experiment's last
  /// options, after its own and its --sources.
  void declare_seeds_and_model(Options& o, std::vector<std::string> heads_quick, std::vector<std::string> heads_paper,
                               Index seqs_quick, Index seqs_paper) {
    o.add("--seeds", seeds_, "number of seeds")
        .preset(1, 3)
        .positive()
        .at_most(kMaxSeeds, "a grid point each")
        .in_point_ids();
    model_.declare(o, std::move(heads_quick), std::move(heads_paper), seqs_quick, seqs_paper);
  }
  virtual void model_points(std::vector<Point>& pts, const std::string& src) const = 0;
  virtual void generated_points(std::vector<Point>& pts, const std::string& src) const = 0;

  std::vector<std::string> sources_;
  Index seeds_ = 1;
  ModelOptions model_;
};

}  // namespace attnlab::experiments
