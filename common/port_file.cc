#include "common/port_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace trainstep {

absl::Status WritePortFile(const std::string& path,
                           const std::vector<std::pair<std::string, int>>& ports) {
  std::string json = "{";
  for (size_t i = 0; i < ports.size(); ++i) {
    absl::StrAppend(&json, i == 0 ? "" : ", ", "\"", ports[i].first, "\": ", ports[i].second);
  }
  absl::StrAppend(&json, "}\n");
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json;
    out.flush();
    if (!out) {
      return absl::InternalError(
          absl::StrCat("--port-file: cannot write ", tmp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("--port-file: cannot rename ", tmp, " to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace trainstep
