// Subcommands of the treemla tool. Each returns the process exit code.
#pragma once

namespace treemla::tool {

int cmd_simulate(int argc, char** argv);    // serving loop (default job)
int cmd_bench(int argc, char** argv);       // GPU benchmark grid (needs a CUDA build and a GPU)
int cmd_bench_pool(int argc, char** argv);  // GPU defrag throughput and commit latency
int cmd_info(int argc, char** argv);        // build and device information
int cmd_schedule(int argc, char** argv);    // the verify schedule's work list, without a GPU

}  // namespace treemla::tool
