// treemla: command-line tool. `treemla` alone runs `treemla simulate` on its default workload.
#include <cstring>
#include <exception>
#include <iostream>
#include <stdexcept>

#include "commands.h"
#include "treemla/error.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: treemla <command> [options]\n\n"
        "commands:\n"
        "  simulate   serving loop on a churning KV pool: DDTree build, verify attention,\n"
        "             acceptance, commit, defragmentation (default command)\n"
        "  bench      GPU benchmark of verify attention against measured ceilings\n"
        "  bench-pool GPU benchmark of defragmentation and commit against the copy ceiling\n"
        "  info       build configuration and visible GPUs\n\n"
        "`treemla <command> --help` lists a command's options.\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace treemla::tool;
  try {
    if (argc < 2) {
      char simulate[] = "simulate";
      char* args[] = {argv[0], simulate, nullptr};
      return cmd_simulate(2, args);
    }
    const char* c = argv[1];
    if (!std::strcmp(c, "--help") || !std::strcmp(c, "-h") || !std::strcmp(c, "help")) {
      usage(std::cout);
      return 0;
    }
    if (!std::strcmp(c, "simulate")) return cmd_simulate(argc, argv);
    if (!std::strcmp(c, "bench")) return cmd_bench(argc, argv);
    if (!std::strcmp(c, "bench-pool")) return cmd_bench_pool(argc, argv);
    if (!std::strcmp(c, "info")) return cmd_info(argc, argv);
    std::cerr << "treemla: unknown command '" << c << "'\n\n";
    usage(std::cerr);
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "treemla: " << e.what() << "\n";
    return 2;
  } catch (const treemla::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "treemla: " << e.what() << "\n";
    return 1;
  }
}
