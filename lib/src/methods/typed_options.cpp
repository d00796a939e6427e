// The typed options of every registered method: from() is what the spec parser's validated parameters hold,
// spec() writes a struct back as a spec; and the TypedMethod instantiations (one translation unit for all).
#include "attnlab/methods/all.hpp"

#include <fmt/format.h>

namespace attnlab {

ExactOptions ExactOptions::from(const Params& p) {
  ExactOptions o;
  o.impl = p.choice("impl");
  o.tile = Index(p.integer("tile"));
  return o;
}

std::string ExactOptions::spec() const {
  return fmt::format("exact:impl={},tile={}", impl, tile);
}

template class TypedMethod<float, ExactOptions>;
template class TypedMethod<double, ExactOptions>;

LinearOptions LinearOptions::from(const Params& p) {
  LinearOptions o;
  o.feature = p.choice("feature");
  o.causal_form = p.choice("causal_form");
  o.chunk = Index(p.integer("chunk"));
  return o;
}

std::string LinearOptions::spec() const {
  return fmt::format("linear:feature={},causal_form={},chunk={}", feature, causal_form, chunk);
}

template class TypedMethod<float, LinearOptions>;
template class TypedMethod<double, LinearOptions>;

EfficientOptions EfficientOptions::from(const Params&) {  // no parameters
  EfficientOptions o;
  return o;
}

std::string EfficientOptions::spec() const { return kName; }

template class TypedMethod<float, EfficientOptions>;
template class TypedMethod<double, EfficientOptions>;

TaylorOptions TaylorOptions::from(const Params& p) {
  TaylorOptions o;
  o.causal_form = p.choice("causal_form");
  o.chunk = Index(p.integer("chunk"));
  return o;
}

std::string TaylorOptions::spec() const {
  return fmt::format("taylor:causal_form={},chunk={}", causal_form, chunk);
}

template class TypedMethod<float, TaylorOptions>;
template class TypedMethod<double, TaylorOptions>;

PerformerOptions PerformerOptions::from(const Params& p) {
  PerformerOptions o;
  o.features = Index(p.integer("features"));
  o.kernel = p.choice("kernel");
  o.orthogonal = p.boolean("orthogonal");
  o.norms = p.choice("norms");
  o.seed = std::uint64_t(p.integer("seed"));
  o.causal_form = p.choice("causal_form");
  o.chunk = Index(p.integer("chunk"));
  return o;
}

std::string PerformerOptions::spec() const {
  return fmt::format("performer:features={},kernel={},orthogonal={},norms={},seed={},causal_form={},chunk={}", features, kernel, orthogonal ? "true" : "false", norms, seed, causal_form, chunk);
}

template class TypedMethod<float, PerformerOptions>;
template class TypedMethod<double, PerformerOptions>;

NystromOptions NystromOptions::from(const Params& p) {
  NystromOptions o;
  o.landmarks = Index(p.integer("landmarks"));
  o.pinv = p.choice("pinv");
  o.iters = Index(p.integer("iters"));
  o.select = p.choice("select");
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string NystromOptions::spec() const {
  return fmt::format("nystrom:landmarks={},pinv={},iters={},select={},seed={}", landmarks, pinv, iters, select, seed);
}

template class TypedMethod<float, NystromOptions>;
template class TypedMethod<double, NystromOptions>;

LinformerOptions LinformerOptions::from(const Params& p) {
  LinformerOptions o;
  o.k = Index(p.integer("k"));
  o.projection = p.choice("projection");
  o.share_kv = p.boolean("share_kv");
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string LinformerOptions::spec() const {
  return fmt::format("linformer:k={},projection={},share_kv={},seed={}", k, projection, share_kv ? "true" : "false", seed);
}

template class TypedMethod<float, LinformerOptions>;
template class TypedMethod<double, LinformerOptions>;

SvdOptions SvdOptions::from(const Params& p) {
  SvdOptions o;
  o.rank = Index(p.integer("rank"));
  o.dense_limit = Index(p.integer("dense_limit"));
  o.solver = p.choice("solver");
  return o;
}

std::string SvdOptions::spec() const {
  return fmt::format("svd:rank={},dense_limit={},solver={}", rank, dense_limit, solver);
}

template class TypedMethod<float, SvdOptions>;
template class TypedMethod<double, SvdOptions>;

CurOptions CurOptions::from(const Params& p) {
  CurOptions o;
  o.columns = Index(p.integer("columns"));
  o.select = p.choice("select");
  o.rcond = p.real("rcond");
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string CurOptions::spec() const {
  return fmt::format("cur:columns={},select={},rcond={},seed={}", columns, select, rcond, seed);
}

template class TypedMethod<float, CurOptions>;
template class TypedMethod<double, CurOptions>;

VqOptions VqOptions::from(const Params& p) {
  VqOptions o;
  o.codes = Index(p.integer("codes"));
  o.iters = Index(p.integer("iters"));
  o.assign = p.choice("assign");
  o.temperature = p.real("temperature");
  o.quantize = p.choice("quantize");
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string VqOptions::spec() const {
  return fmt::format("vq:codes={},iters={},assign={},temperature={},quantize={},seed={}", codes, iters, assign, temperature, quantize, seed);
}

template class TypedMethod<float, VqOptions>;
template class TypedMethod<double, VqOptions>;

ProbsparseOptions ProbsparseOptions::from(const Params& p) {
  ProbsparseOptions o;
  o.factor = p.real("factor");
  o.samples = Index(p.integer("samples"));
  o.sample = p.choice("sample");
  o.measure = p.choice("measure");
  o.lazy = p.choice("lazy");
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string ProbsparseOptions::spec() const {
  return fmt::format("probsparse:factor={},samples={},sample={},measure={},lazy={},seed={}", factor, samples, sample, measure, lazy, seed);
}

template class TypedMethod<float, ProbsparseOptions>;
template class TypedMethod<double, ProbsparseOptions>;

LocalOptions LocalOptions::from(const Params& p) {
  LocalOptions o;
  o.window = Index(p.integer("window"));
  return o;
}

std::string LocalOptions::spec() const {
  return fmt::format("local:window={}", window);
}

template class TypedMethod<float, LocalOptions>;
template class TypedMethod<double, LocalOptions>;

SparseOptions SparseOptions::from(const Params& p) {
  SparseOptions o;
  o.window = Index(p.integer("window"));
  o.stride = Index(p.integer("stride"));
  o.globals = Index(p.integer("globals"));
  o.random = Index(p.integer("random"));
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string SparseOptions::spec() const {
  return fmt::format("sparse:window={},stride={},globals={},random={},seed={}", window, stride, globals, random, seed);
}

template class TypedMethod<float, SparseOptions>;
template class TypedMethod<double, SparseOptions>;

ReformerOptions ReformerOptions::from(const Params& p) {
  ReformerOptions o;
  o.buckets = Index(p.integer("buckets"));
  o.rounds = Index(p.integer("rounds"));
  o.chunk = Index(p.integer("chunk"));
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string ReformerOptions::spec() const {
  return fmt::format("reformer:buckets={},rounds={},chunk={},seed={}", buckets, rounds, chunk, seed);
}

template class TypedMethod<float, ReformerOptions>;
template class TypedMethod<double, ReformerOptions>;

ScatterbrainOptions ScatterbrainOptions::from(const Params& p) {
  ScatterbrainOptions o;
  o.features = Index(p.integer("features"));
  o.window = Index(p.integer("window"));
  o.seed = std::uint64_t(p.integer("seed"));
  return o;
}

std::string ScatterbrainOptions::spec() const {
  return fmt::format("scatterbrain:features={},window={},seed={}", features, window, seed);
}

template class TypedMethod<float, ScatterbrainOptions>;
template class TypedMethod<double, ScatterbrainOptions>;

}  // namespace attnlab
