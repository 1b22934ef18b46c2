// `strata doctor`: what this machine offers an offload run, and what is broken. Placeholder until
// the full report lands (devices, cores/NUMA, io_uring, O_DIRECT, memlock, free space).
#include "tools/commands.h"

#include <cstdio>

namespace strata::tools {

void register_doctor(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand("doctor", "report what this machine offers an offload run");
  auto dir = std::make_shared<std::string>(".");
  cmd->add_option("--dir", *dir, "directory that will hold NVMe swap files");
  table[cmd] = [dir] {
    std::printf("strata doctor: (report not yet implemented) dir=%s\n", dir->c_str());
    return 0;
  };
}

}  // namespace strata::tools
