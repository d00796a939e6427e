// Real attention read from disk: a model export — the Q, K, V that tools/trained_attention.py exported from a small
// byte-level transformer trained on the Python standard library (parts `trained`, `initialized`), or that
// attnlab.torch.capture(model).save(DIR) captured from the user's own PyTorch model (part `captured`, which
// `attnlab report --model-dir` reads) — and the user's own .npy files (source `files`: --q, --k, --v, (n, d) or
// (h, n, d), one point per head).
//
// The export layout (DIR: --model-dir, --model-data; default $ATTNLAB_MODEL_DATA, else data/attention):
//   DIR/meta.json   a JSON object, written last (without it the export is missing or was interrupted), holding
//                   "key": a string of lowercase hex digits ([0-9a-f]+) naming the data, e.g. a hash of the arrays;
//                          part of every result row's id, so regenerated data is never mixed with old rows
//                   "bidirectional": true (every position attends to every other: a masked LM, an encoder) or false
//                          (a causal model: the report needs --causal; the non-causal experiments refuse it)
//                   Other fields are free: trained_attention.py writes its configuration, training curve and
//                   checksums; capture writes "source", "layers" (the modules' names) and "layout".
//   DIR/PART/seq{s}_layer{l}_{q,k,v}.npy   (heads, n, d_head), float32 or float64, for sequences s = 0, 1, ... and
//                   layers l = 0, 1, ... (no gaps); Q and K before the 1/√d_head scale. PART: trained/ and
//                   initialized/ (tools/trained_attention.py --out DIR), captured/ (attnlab.torch.capture(model)
//                   .save(DIR): sequence s is the s-th batch entry of the forward calls in order).
//   DIR/PART/seq0_layer{l}_attn.npy        optional, (heads, n, n): the model's own softmax, for checking
//   DIR/PART/seq{s}_layer{l}_do.npy        optional, (heads, n, d_head): ∂(held-out loss)/∂(attention output)
//
// The user's .npy files say whether their model is causal through a sidecar (mask_statement()): for FILE.npy the
// first of FILE.npy.json, meta.json in FILE's directory and — when that directory is an export's part (captured/,
// trained/, initialized/) — the export's DIR/meta.json that holds "causal": true|false or "bidirectional":
// true|false. Bare files say nothing: the report then states that it treats their attention as bidirectional.
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

/// What files say about their model's attention mask: causal, bidirectional, or nothing.
struct MaskStatement {
  std::optional<bool> causal;  ///< absent: nothing says (bare .npy files)
  std::string said_by;         ///< the file that says it: a sidecar, an export's meta.json
};

/// The mask statement of a .npy file's sidecar (see the layout above): nothing when no sidecar holds "causal" or
/// "bidirectional". Throws Error naming the sidecar when either is not true/false, or when the two disagree.
MaskStatement mask_statement(const std::string& npy_path);

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
  /// A source whose heads are loaded rather than generated: the exported models (trained, initialized,
  /// trained_causal; pretrained: all-MiniLM-L6-v2's export by tools/pretrained.py) or the user's files (files).
  static bool is_model_source(const std::string& source) {
    return source == "trained" || source == "initialized" || source == "trained_causal" || source == "pretrained" ||
           source == "files";
  }
  /// $ATTNLAB_MODEL_DATA if set, else "data/attention" (relative to the working directory).
  static std::string default_dir();

  /// Scans DIR/MODEL; throws Error saying what is wrong (no meta.json; its "key" absent or not lowercase hex; its
  /// "bidirectional" absent or not true/false; no seq0_layer0_q.npy), what a valid export is (layout()) and how to
  /// make one: `make`, or by default the tools/trained_attention.py command.
  /// `name` labels the source in the rows (default: `model`): "trained_causal" is DIR_causal's "trained",
  /// "pretrained" the pretrained model's "captured".
  ModelData(const std::string& dir, const std::string& model, const std::string& name = "",
            const std::string& make = "");
  /// What a valid export in DIR with part MODEL is, in one clause for messages: "a valid export is DIR/meta.json ...".
  static std::string layout(const std::string& dir, const std::string& model);
  /// The user's files as source `files`: one "layer", one "sequence", their heads; bidirectional (the user chooses).
  explicit ModelData(std::shared_ptr<const UserFiles> files);

  const std::string& model() const { return model_; }
  /// The export's cache key (meta.json): part of every point id, so regenerated data is never mixed with old rows.
  const std::string& key() const { return key_; }
  bool bidirectional() const { return bidirectional_; }
  /// What the export's meta.json says about the mask (said_by: DIR/meta.json); nothing for the user's files.
  MaskStatement mask() const;
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
