// The test binary as a server of forked tests (Note [Tests forked from a loaded binary] in
// forked_test_server.cpp): CTest's fixture starts it, dptrain_test_client hands it each test.
// Not here: the client (forked_test_client.cpp), the wire format (forked_test_protocol.h).
#pragma once

namespace dptrain::testing {

// The first argument that makes the test binary serve instead of running tests.
constexpr char kServeForkedTestsFlag[] = "--serve-forked-tests";

// Binds the socket, leaves a server behind that lives as long as this process's parent (CTest)
// and returns 0; or says in one line why it does not serve (the tests then run one process
// each, as before) and returns 0 too: serving is an optimisation, never a reason to fail a run.
// `run_tests` is main's test runner, called in each forked test with the client's arguments.
int serve_forked_tests(int (*run_tests)(int argc, char** argv));

// The threads of this process (/proc/self/status), -1 where unreadable: the server serves only
// at one, and the probes (forked_test_probes.cpp) report it for the checker to compare.
int current_thread_count();

}  // namespace dptrain::testing
