// The Method base: validation, the causal refusal, and the compute()/info() protocol.
#include "attnlab/core/method.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"

#include <fmt/format.h>

#include <cmath>
#include <type_traits>

namespace attnlab {

template <typename T>
Method<T>::Method(const MethodDescriptor& descriptor) : descriptor_(descriptor) {}

template <typename T>
const std::string& Method<T>::name() const {
  return descriptor_.name;
}

template <typename T>
std::string Method<T>::spec() const {
  const std::string p = params().to_string();
  return p.empty() ? descriptor_.name : descriptor_.name + ":" + p;
}

template <typename T>
bool Method<T>::supports_causal() const {
  return descriptor_.causal;
}

template <typename T>
Method<T>& Method<T>::compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  if (opts.causal && !supports_causal())
    throw Error(fmt::format("method '{}' cannot honour a causal mask ({}); use a method that supports "
                            "causal attention (see `attnlab methods`)",
                            descriptor_.name, descriptor_.summary));
  if (opts.storage != Storage::native) {
    require(std::is_same_v<T, float>,
            "method '{}': {} storage is emulated over float32 accumulation; give float32 inputs (Method<float>)",
            descriptor_.name, storage_name(opts.storage));
    check_storage_support(opts.storage, opts.policy);
  }
  AttentionOptions resolved = opts;
  resolved.scale = opts.resolved_scale(q.cols());
  status_ = Status::NotComputed;
  check_limits(descriptor_, params(), q.rows(), k.rows());  // the parameters' declared limits, on these inputs
  opts_ = resolved;  // before do_compute: its rounding hook reads the storage and the policy
  rounding_.clear();
  output_check_ = {};
  gradient_check_ = {};
  if (resolved.storage == Storage::native) {
    status_ = do_compute(q, k, resolved);
  } else {
    // The inputs as the user stores them: in the format.
    MatrixR<T> qs = q, ks = k;
    const Rounding r = rounding_hook();
    r(qs, Held::tensor, "inputs Q, K");
    r(ks, Held::tensor, "inputs Q, K");
    status_ = do_compute(qs, ks, resolved);
    rounding_.fitted();
  }
  n_q_ = q.rows();
  n_k_ = k.rows();
  return *this;
}

template <typename T>
void Method<T>::check_storage_support(Storage storage, Policy policy) const {
  if (storage == Storage::native) return;
  check_storage(descriptor_, storage, policy);
  check_params_storage(storage, policy);
}

template <typename T>
void Method<T>::require_computed(const char* what) const {
  if (status_ == Status::NotComputed)
    throw Error(fmt::format("method '{}': {} called before compute()", descriptor_.name, what));
}

template <typename T>
MatrixR<T> Method<T>::output(const ConstRef<T>& v) const {
  require_computed("output()");
  validate_v(n_k_, v.rows());
  if (opts_.storage == Storage::native) return do_output(v);
  rounding_.begin_output();  // this call's tallies, not every call's since compute()
  const Rounding r = rounding_hook();
  MatrixR<T> vs = v;
  r(vs, Held::tensor, "input V");
  MatrixR<T> out = do_output(vs);
  r(out, Held::tensor, "output O");
  rounding_.end_output();
  output_check_ = check_output<T>(out);  // the no-silent-NaN rule (output_check())
  // Rows of zeros are the silent failure only where there was something to average: a V of zeros (the user's, not one
  // that the format flushed to zero, which stays a finding) gives them by right.
  if (output_check_.zero_rows > 0 && (v.array() == T(0)).all()) output_check_.zero_rows = 0;
  return out;
}

template <typename T>
const AttentionOperator<T>& Method<T>::op() const {
  require_computed("op()");
  return do_op();
}

template <typename T>
MatrixR<T> Method<T>::matrix() const {
  require_computed("matrix()");
  return do_matrix();
}

template <typename T>
Gradients<T> Method<T>::backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  require_computed("backward()");
  // A method without a backward says so under any storage (not "not emulated").
  if (!descriptor_.backward) return do_backward(v, d_out);
  require(opts_.storage == Storage::native || descriptor_.storage.backward,
          "method '{}': the backward pass under {} storage is not emulated yet (the forward is)", descriptor_.name,
          storage_name(opts_.storage));
  validate_v(n_k_, v.rows());
  require(d_out.rows() == n_q_ && d_out.cols() == v.cols(),
          "method '{}': backward: dO is {}×{}, the output is {}×{} (n_q × d_v)", descriptor_.name,
          d_out.rows(), d_out.cols(), n_q_, v.cols());
  require(all_finite(v) && all_finite(d_out),
          "method '{}': backward: V and dO must be finite", descriptor_.name);
  if (opts_.storage == Storage::native) {
    Gradients<T> g = do_backward(v, d_out);
    check_gradient_shapes(g, v.cols());
    return g;
  }
  // Emulated: V and the upstream dO as the user stores them, the method's intermediates as its note says, and the
  // gradients stored in the format; checked for non-finite entries and zero rows (the no-silent-NaN rule).
  rounding_.begin_backward();
  const Rounding r = rounding_hook();
  MatrixR<T> vs = v, dos = d_out;
  r(vs, Held::tensor, "input V");
  r(dos, Held::tensor, "upstream dO");
  Gradients<T> g = do_backward(vs, dos);
  check_gradient_shapes(g, v.cols());
  r(g.dq, Held::tensor, "gradients dQ, dK, dV");
  r(g.dk, Held::tensor, "gradients dQ, dK, dV");
  r(g.dv, Held::tensor, "gradients dQ, dK, dV");
  OutputCheck c;
  for (const MatrixR<T>* x : {&g.dq, &g.dk, &g.dv}) {
    const OutputCheck p = check_output<T>(*x);
    c.entries += p.entries;
    c.nonfinite += p.nonfinite;
    c.rows += p.rows;
    c.zero_rows += p.zero_rows;
  }
  gradient_check_ = c;
  return g;
}

template <typename T>
void Method<T>::check_gradient_shapes(const Gradients<T>& g, Index dv) const {
  if (g.dq.rows() != n_q_ || g.dk.rows() != n_k_ || g.dv.rows() != n_k_ || g.dv.cols() != dv)
    throw Error(fmt::format("internal: method '{}': backward returned gradients of the wrong shape", descriptor_.name));
}

template <typename T>
Gradients<T> Method<T>::do_backward(const ConstRef<T>&, const ConstRef<T>&) const {
  throw Error(fmt::format("method '{}' has no backward pass: {}", descriptor_.name, descriptor_.backward_note));
}

template class Method<float>;
template class Method<double>;

}  // namespace attnlab
