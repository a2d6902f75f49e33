// treemla: command-line tool. `treemla` alone, or with options and no command, runs
// `treemla simulate`.
#include <cstring>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "commands.h"
#include "treemla/error.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: treemla [command] [options]\n\n"
        "commands:\n"
        "  simulate   serving loop on a churning KV pool: DDTree build, verify attention,\n"
        "             acceptance, commit, defragmentation (the default: `treemla --rounds 5`\n"
        "             is `treemla simulate --rounds 5`)\n"
        "  bench      GPU benchmark of verify attention against measured ceilings\n"
        "  bench-pool GPU benchmark of defragmentation and commit against the copy ceiling\n"
        "  info       build configuration and visible GPUs\n"
        "  schedule   the work list the verify schedule makes for a call (no GPU needed)\n\n"
        "`treemla <command> --help` lists a command's options.\n";
}

bool is_help(const char* a) {
  return !std::strcmp(a, "--help") || !std::strcmp(a, "-h") || !std::strcmp(a, "help");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace treemla::tool;
  try {
    if (argc >= 2 && is_help(argv[1])) {
      usage(std::cout);
      return 0;
    }
    if (argc < 2 || argv[1][0] == '-') {  // no command: the default job, with these options
      char simulate[] = "simulate";
      std::vector<char*> args{argv[0], simulate};
      args.insert(args.end(), argv + 1, argv + argc);
      args.push_back(nullptr);
      return cmd_simulate(argc + 1, args.data());
    }
    const char* c = argv[1];
    if (!std::strcmp(c, "simulate")) return cmd_simulate(argc, argv);
    if (!std::strcmp(c, "bench")) return cmd_bench(argc, argv);
    if (!std::strcmp(c, "bench-pool")) return cmd_bench_pool(argc, argv);
    if (!std::strcmp(c, "info")) return cmd_info(argc, argv);
    if (!std::strcmp(c, "schedule")) return cmd_schedule(argc, argv);
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
