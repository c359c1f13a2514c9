// main of the test binaries: gtest's, or the forked test server when CTest's fixture asks for it
// (Note [Tests forked from a loaded binary], forked_test_server.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "support/forked_test_server.h"

namespace {

int run_tests(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], dptrain::testing::kServeForkedTestsFlag) == 0) {
    return dptrain::testing::serve_forked_tests(run_tests);
  }
  return run_tests(argc, argv);
}
