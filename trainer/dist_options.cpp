#include "nanscope/trainer/dist_options.hpp"

#include <string>

namespace nanscope::trainer {

bool distributed_available() {
#ifdef NANSCOPE_HAVE_C10D_GLOO
  return true;
#else
  return false;
#endif
}

void validate(const DistOptions& o) {
  if (o.world_size < 1) throw std::invalid_argument("--world-size (WORLD_SIZE) must be at least 1");
  if (o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("--rank (RANK) " + std::to_string(o.rank) + " is outside [0, " +
                                std::to_string(o.world_size) + ")");
  if (o.master_port < 1 || o.master_port > 65535)
    throw std::invalid_argument("--master-port (MASTER_PORT) must be in 1..65535");
  if (o.timeout_s <= 0) throw std::invalid_argument("--dist-timeout must be positive");
  if (o.bucket_mb <= 0) throw std::invalid_argument("--bucket-mb must be positive");
  if (o.enabled() && !distributed_available())
    throw std::invalid_argument(
        "WORLD_SIZE > 1 but this nanscope-train was built without c10d Gloo (install libgloo-dev "
        "and rebuild)");
}

}  // namespace nanscope::trainer
