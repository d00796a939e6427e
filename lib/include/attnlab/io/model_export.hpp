// Real attention: the Q, K, V that tools/trained_attention.py exported from a small byte-level transformer trained on
// the Python standard library (source `trained`) and from the same model at initialisation (`initialized`) — and the
// user's own (source `files`: --q, --k, --v, (n, d) or (h, n, d) .npy, one point per head).
// Layout under DIR (default $ATTNLAB_MODEL_DATA, else data/attention):
//   meta.json                                   written last; says whether the model is bidirectional
//   {trained,initialized}/seq{s}_layer{l}_{q,k,v}.npy   (heads, n, d_head), Q and K before the 1/√d_head scale
//   {trained,initialized}/seq0_layer{l}_attn.npy         (heads, n, n), the model's own softmax, for checking
//   {trained,initialized}/seq{s}_layer{l}_do.npy         (heads, n, d_head), ∂(held-out loss)/∂(attention output)
#pragma once

#include "attnlab/io/npy.hpp"
#include "attnlab/io/sources.hpp"
#include "attnlab/core/types.hpp"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

/// One attention head of one held-out sequence (or of the user's files).
struct ModelHead {
  Index seq = 0, layer = 0, head = 0;
  bool file = false;  ///< a head of the user's files (no layers, no sequences)
  /// "L{layer}H{head}" — how the CSVs name a model head (the sequence goes in the seed column); "head{h}" for files.
  std::string label() const;
};

/// The user's files: --q, --k and --v (.npy, (n, d) or (h, n, d)).
struct FileOptions {
  std::string q, k, v;
  bool given() const { return !q.empty(); }
};

/// The user's files read and checked: the same heads and d in Q and K, the same n_k in K and V, finite values, one
/// dtype (mixed float32/float64 files are refused, as by the command and the Python module: the experiments compute
/// in float64 and no dtype was chosen).
struct UserFiles {
  NpyArray q, k;
  std::optional<NpyArray> v;  ///< absent when the experiment needs no values (spectrum)
  /// Throws Error naming the option or file at fault; `experiment` prefixes the messages.
  static std::shared_ptr<const UserFiles> read(const FileOptions& files, const std::string& experiment, bool need_v);
};

class ModelData {
 public:
  /// A source whose heads are loaded rather than generated: the exported model (trained, initialized) or the user's
  /// files (files).
  static bool is_model_source(const std::string& source) {
    return source == "trained" || source == "initialized" || source == "trained_causal" || source == "files";
  }
  /// $ATTNLAB_MODEL_DATA if set, else "data/attention" (relative to the working directory).
  static std::string default_dir();

  /// Scans DIR/MODEL; throws Error naming the command that makes the data when it is missing or incomplete.
  /// `name` labels the source in the rows (default: `model`): "trained_causal" is DIR_causal's "trained".
  ModelData(const std::string& dir, const std::string& model, const std::string& name = "");
  /// The user's files as source `files`: one "layer", one "sequence", their heads; bidirectional (the user chooses).
  explicit ModelData(std::shared_ptr<const UserFiles> files);

  const std::string& model() const { return model_; }
  /// The export's cache key (meta.json): part of every point id, so regenerated data is never mixed with old rows.
  const std::string& key() const { return key_; }
  bool bidirectional() const { return bidirectional_; }
  Index sequences() const { return sequences_; }
  Index layers() const { return layers_; }
  Index heads() const { return heads_; }
  Index n() const { return n_; }
  Index d() const { return d_; }

  /// The heads to use: `spec` holds "all", "diagonal" (head l mod heads of layer l) or "L:H" items (e.g. "0:0,3:1");
  /// `max_seqs` ≤ 0 means every sequence. The user's files: every head, whatever `spec` says.
  std::vector<ModelHead> select(const std::vector<std::string>& spec, Index max_seqs) const;
  /// "source=MODEL key=KEY seq=S L{layer}H{head}": the part of a grid point's id that names the head.
  std::string point_id(const ModelHead& h) const;
  /// "MODEL/L{layer}H{head}": the source column of per-head rows.
  std::string source_label(const ModelHead& h) const { return name_ + "/" + h.label(); }
  /// Q, K, V of one head in double precision (V: the head's values).
  Qkv<double> load(const ModelHead& h) const;
  /// Whether the export holds the head's upstream gradient dO = ∂loss/∂O (seq{s}_layer{l}_do.npy).
  bool has_upstream(const ModelHead& h) const;
  /// The upstream gradient of the head's attention output, ∂(held-out loss)/∂O (n × d_head, float64): what the model
  /// sends back into the attention when it trains on that sequence. Throws Error when the export has none.
  MatrixR<double> upstream(const ModelHead& h) const;
  /// The model's own attention of sequence 0 for (layer, head); empty when the export has none.
  MatrixR<double> model_attention(Index layer, Index head) const;

 private:
  std::string file(Index seq, Index layer, const char* what) const;
  std::shared_ptr<const UserFiles> files_;  ///< source `files`
  std::string dir_, model_, key_, name_;
  bool bidirectional_ = true;
  Index sequences_ = 0, layers_ = 0, heads_ = 0, n_ = 0, d_ = 0;
};

}  // namespace attnlab
