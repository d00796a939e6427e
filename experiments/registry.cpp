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

std::vector<std::unique_ptr<Experiment>> all_experiments() {
  std::vector<std::unique_ptr<Experiment>> v;
  v.push_back(make_spectrum_experiment());
  v.push_back(make_error_vs_budget_experiment());
  v.push_back(make_error_vs_length_experiment());
  v.push_back(make_pinv_experiment());
  v.push_back(make_performer_mse_experiment());
  v.push_back(make_probsparse_experiment());
  v.push_back(make_vq_experiment());
  v.push_back(make_scaling_experiment());
  v.push_back(make_regimes_experiment());
  return v;
}

}  // namespace attnlab::experiments
