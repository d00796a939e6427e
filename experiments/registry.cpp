// The experiments, in a fixed order (an explicit list, as the method registry).
#include "sweep.hpp"

namespace attnlab::experiments {

std::unique_ptr<Experiment> make_pinv_experiment();
std::unique_ptr<Experiment> make_error_vs_budget_experiment();
std::unique_ptr<Experiment> make_spectrum_experiment();
std::unique_ptr<Experiment> make_error_vs_length_experiment();
std::unique_ptr<Experiment> make_performer_mse_experiment();
std::unique_ptr<Experiment> make_vq_experiment();
std::unique_ptr<Experiment> make_regimes_experiment();
std::unique_ptr<Experiment> make_probsparse_experiment();
std::unique_ptr<Experiment> make_scaling_experiment();
std::unique_ptr<Experiment> make_gradients_experiment();
std::unique_ptr<Experiment> make_precision_experiment();

std::vector<std::unique_ptr<Experiment>> all_experiments() {
  // name (`attnlab run NAME`, results/NAME.csv.gz) and the question it answers (its --help line).
  const struct {
    const char* name;
    const char* question;
    std::unique_ptr<Experiment> (*make)();
  } table[] = {
      {"spectrum", "is attention low-rank? singular-value spectra of P (Linformer Fig. 1)", make_spectrum_experiment},
      {"error_vs_budget", "each method's error against its budget, with the Eckart–Young floor",
       make_error_vs_budget_experiment},
      {"error_vs_length", "error against n at a fixed budget (can k, m stay constant?)",
       make_error_vs_length_experiment},
      {"pinv", "pseudo-inverse convergence on landmark matrices, and Nyström's error against the iteration count",
       make_pinv_experiment},
      {"performer_mse", "Performer kernel and output MSE against M, and Lemma 2", make_performer_mse_experiment},
      {"probsparse", "Informer's sparsity measure: M vs M̄, top-u recall, error vs c", make_probsparse_experiment},
      {"vq", "Transformer-VQ against codebook size, soft vs hard, vs Performer", make_vq_experiment},
      {"scaling", "time and peak memory against n, relative to exact attention", make_scaling_experiment},
      {"regimes", "which of low-rank, sparse, sparse+low-rank wins at which entropy", make_regimes_experiment},
      {"gradients", "how far each method's dQ, dK, dV are from exact attention's, beside its output error",
       make_gradients_experiment},
      {"precision", "each method in fp32 and in emulated bf16 and fp16 (eager and careful): rounding against "
       "approximation error, overflow, the first failing length and temperature", make_precision_experiment},
  };
  std::vector<std::unique_ptr<Experiment>> v;
  for (const auto& e : table) {
    v.push_back(e.make());
    v.back()->name_ = e.name;
    v.back()->question_ = e.question;
  }
  return v;
}

}  // namespace attnlab::experiments
