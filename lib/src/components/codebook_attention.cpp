// Transformer-VQ's attention for a given codebook (Lingle 2023): the keys' nearest codes and the hard-assignment
// operator over them (operators/codebook.hpp).
#include "attnlab/components/codebook_attention.hpp"

#include "attnlab/components/kmeans.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/operators/codebook.hpp"

namespace attnlab {

template <typename T>
std::unique_ptr<AttentionOperator<T>> codebook_attention(const ConstRef<T>& q, const ConstRef<T>& k,
                                                         const ConstRef<T>& codebook, const AttentionOptions& opts) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  require(codebook.cols() == k.cols() && codebook.rows() >= 1, "vq: the codebook must have the keys' dimension");
  MatrixR<T> logits = (q * codebook.transpose()) * T(opts.resolved_scale(q.cols()));
  return std::make_unique<CodebookOperator<T>>(std::move(logits), nearest<T>(k, codebook), opts.causal);
}

template std::unique_ptr<AttentionOperator<float>> codebook_attention<float>(const ConstRef<float>&,
                                                                            const ConstRef<float>&,
                                                                            const ConstRef<float>&,
                                                                            const AttentionOptions&);
template std::unique_ptr<AttentionOperator<double>> codebook_attention<double>(const ConstRef<double>&,
                                                                              const ConstRef<double>&,
                                                                              const ConstRef<double>&,
                                                                              const AttentionOptions&);

}  // namespace attnlab
