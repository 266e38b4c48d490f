// nanscope-replay for the user-loop example: the same command line, and it can
// rebuild "user_net", the model of net.hpp.
#include "nanscope/replay/model_registry.hpp"
#include "net.hpp"

int main(int argc, char** argv) {
  nanscope::replay::register_model("user_net",
                                   [](const nanscope::ModelSpec&) { return make_model(std::make_shared<Net>()); });
  return nanscope::replay::replay_main(argc, argv);
}
