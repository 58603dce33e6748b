#include "engine/train/run_training.h"

namespace ferry {

Status RunTraining(const JobSpec& job, const ModelConfig& model) {
  (void)job;
  (void)model;
  return Status::Unavailable(
      "training is not wired yet: the model layers and the trainer are "
      "still being written (issue 3)");
}

}  // namespace ferry
