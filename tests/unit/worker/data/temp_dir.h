// A fresh directory under /tmp for the data tests, removed with everything in it when the
// test ends.
#ifndef TRAINSTEP_TESTS_UNIT_WORKER_DATA_TEMP_DIR_H_
#define TRAINSTEP_TESTS_UNIT_WORKER_DATA_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace trainstep::data {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/trainstep_data_test_XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Writes `content` to path()/relative, creating parent directories; returns the full path.
  std::string Write(const std::string& relative, const std::string& content) const {
    const std::filesystem::path full = std::filesystem::path(path_) / relative;
    std::filesystem::create_directories(full.parent_path());
    std::ofstream(full, std::ios::binary) << content;
    return full.string();
  }

 private:
  std::string path_;
};

}  // namespace trainstep::data

#endif  // TRAINSTEP_TESTS_UNIT_WORKER_DATA_TEMP_DIR_H_
