#!/usr/bin/env python3
"""A test run by the forked test server behaves as the same test run alone
(CTest ForkedTests.ServedTestsBehaveAsRunAlone; Note [Tests forked from a loaded binary] in
tests/support/forked_test_server.cpp).

It runs the ForkedTestProbe tests through dptrain_test_client with no server (the client becomes
the binary, as CTest ran tests before), starts a server of its own on a socket of its own
(DPTRAIN_FORKED_TEST_SOCKET, so CTest's server is untouched), and runs them again: the same exit
status or signal, the same failure text, the same working directory, umask, threads, descriptors
and signal dispositions, and served in another process. Then what must not be served is not (a
changed environment, a binary that is not the server's, a junk request), a killed client takes
its test and the test's children with it, a socket past sun_path's 108 bytes works, and --stop
stops the server.

usage: check_forked_tests.py --client dptrain_test_client --binary dptrain_tests
"""
import argparse
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

PROBE = "ForkedTestProbe."


def run(client, binary, test, env, cwd=None, timeout=120):
    return subprocess.run([client, binary, f"--gtest_filter={PROBE}{test}"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def report(result):
    """The probe's fields, from its 'probe: key=value' lines."""
    fields = dict(line[len("probe: "):].split("=", 1) for line in result.stdout.splitlines()
                  if line.startswith("probe: "))
    if "pid" not in fields:
        raise AssertionError(f"no probe lines in:\n{result.stdout}\n{result.stderr}")
    return fields


def comparable(output):
    """gtest's output without what differs between any two runs: times, pids, addresses."""
    output = re.sub(r"\(\d+ ms( total)?\)", "(T ms)", output)
    return re.sub(r"pid=\d+", "pid=P", output)


class Checker:
    def __init__(self, client, binary, root):
        self.client, self.binary, self.root = client, binary, root
        self.socket = os.path.join(root, "server.sock")
        self.env = dict(os.environ, DPTRAIN_FORKED_TEST_SOCKET=self.socket)
        self.failures = []

    def expect(self, condition, what):
        print(("ok    " if condition else "FAIL  ") + what)
        if not condition:
            self.failures.append(what)

    def spawn(self, test, env=None, binary=None, stdout=subprocess.PIPE):
        """The client running one probe, started and not yet waited for."""
        command = [self.client, binary or self.binary, f"--gtest_filter={PROBE}{test}"]
        return subprocess.Popen(command, env=env or self.env, stdout=stdout, text=True)

    def start_server(self, env=None):
        started = subprocess.run([self.client, self.binary, "--serve-forked-tests"],
                                 env=env or self.env, capture_output=True, text=True, timeout=60)
        self.expect(started.returncode == 0 and "forked test server: serving" in started.stdout,
                    f"the server starts: {started.stdout.strip()} {started.stderr.strip()}")

    def outcomes(self, cwd):
        """Each probe's exit status and comparable output, and the report probe's fields."""
        results = {test: run(self.client, self.binary, test, self.env, cwd=cwd)
                   for test in ("ReportsItsProcess", "FailsAnExpectation", "ExitsWithSeven",
                                "Aborts")}
        return results, report(results["ReportsItsProcess"])

    def check_alone_against_served(self):
        work = os.path.join(self.root, "work dir")
        os.mkdir(work)
        alone, alone_fields = self.outcomes(work)
        self.start_server()
        served, served_fields = self.outcomes(work)
        for test in alone:
            self.expect(alone[test].returncode == served[test].returncode,
                        f"{test}: exit status {served[test].returncode} served, "
                        f"{alone[test].returncode} alone")
        self.expect(alone["Aborts"].returncode == -signal.SIGABRT,
                    f"Aborts ends by SIGABRT alone ({alone['Aborts'].returncode})")
        self.expect(alone["ExitsWithSeven"].returncode == 7, "ExitsWithSeven exits 7 alone")
        self.expect(comparable(alone["FailsAnExpectation"].stdout) ==
                    comparable(served["FailsAnExpectation"].stdout),
                    "FailsAnExpectation prints the same served and alone")
        self.expect("the planted failure" in served["FailsAnExpectation"].stdout,
                    "the served failure's message reaches the client's stdout")
        for field in ("cwd", "umask", "threads", "fds", "sigterm", "sigchld", "sigpipe", "probe"):
            self.expect(alone_fields[field] == served_fields[field],
                        f"{field}: {served_fields[field]} served, {alone_fields[field]} alone")
        self.expect(served_fields["cwd"] == work, f"the test runs in the client's directory")
        return served_fields

    def check_served_elsewhere(self):
        """Served runs happen in a forked process; others in the client's own, which exec'd."""
        client = self.spawn("ReportsItsProcess")
        out, _ = client.communicate(timeout=60)
        self.expect(f"pid={client.pid}\n" not in out, "a served test runs in a forked process")
        changed = dict(self.env, DPTRAIN_PROBE="changed")
        client = self.spawn("ReportsItsProcess", env=changed)
        out, _ = client.communicate(timeout=60)
        self.expect(f"pid={client.pid}\n" in out and "probe=changed" in out,
                    "another environment is not served: the client runs the binary itself")
        copy = os.path.join(self.root, "copy_of_binary")
        shutil.copy2(self.binary, copy)
        client = self.spawn("ReportsItsProcess", binary=copy)
        out, _ = client.communicate(timeout=60)
        self.expect(f"pid={client.pid}\n" in out, "another binary is not served")

    def check_junk_request(self):
        """A request that is not one gets kNotServed, so a client would run the test itself."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(30)
            peer.connect(self.socket)
            peer.sendall(b"\xff" * 56)  # the size of a Request (its static_assert), all wrong
            reply = peer.recv(8)
        self.expect(reply == struct.pack("<Ii", 3, 0),
                    f"a junk request is answered kNotServed ({reply!r})")

    def check_killed_client(self):
        pid_file = os.path.join(self.root, "probe.pid")
        env = dict(self.env, DPTRAIN_PROBE_PID_FILE=pid_file)
        # The pid file's variable changes the environment: this server was started with it.
        self.stop_server()
        self.start_server(env)
        client = self.spawn("WaitsToBeKilled", env=env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(pid_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        test_pid, child_pid = (int(pid) for pid in open(pid_file).read().split())
        self.expect(test_pid != client.pid, "the waiting test was served")
        client.kill()  # as CTest's timeout does
        client.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(map(process_alive, (test_pid, child_pid))):
            time.sleep(0.05)
        self.expect(not process_alive(test_pid), "a killed client's test is killed with it")
        self.expect(not process_alive(child_pid),
                    "and so is the test's child in a process group of its own")
        self.stop_server()
        self.start_server()

    def check_long_path(self):
        deep = os.path.join(self.root, *(["d" * 60] * 3))
        os.makedirs(deep)
        socket = os.path.join(deep, "server.sock")
        env = dict(self.env, DPTRAIN_FORKED_TEST_SOCKET=socket)
        self.start_server(env)
        client = self.spawn("ReportsItsProcess", env=env)
        out, _ = client.communicate(timeout=60)
        served = client.returncode == 0 and f"pid={client.pid}\n" not in out
        self.expect(len(socket) > 108 and served, f"a socket path of {len(socket)} bytes is served")
        subprocess.run([self.client, "--stop", self.binary], env=env, capture_output=True,
                       timeout=60)

    def stop_server(self):
        stopped = subprocess.run([self.client, "--stop", self.binary], env=self.env,
                                 capture_output=True, text=True, timeout=60)
        deadline = time.monotonic() + 10
        while os.path.exists(self.socket) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.expect(stopped.returncode == 0 and not os.path.exists(self.socket),
                    f"--stop stops the server: {stopped.stdout.strip()}")

    def check_stop(self):
        self.stop_server()
        client = self.spawn("ReportsItsProcess")
        out, _ = client.communicate(timeout=60)
        self.expect(client.returncode == 0 and f"pid={client.pid}\n" in out,
                    "with the server stopped, the client runs the binary itself")


def process_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", required=True)
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dptrain-forked-") as root:
        checker = Checker(os.path.abspath(args.client), os.path.abspath(args.binary), root)
        try:
            checker.check_alone_against_served()
            checker.check_served_elsewhere()
            checker.check_junk_request()
            checker.check_killed_client()
            checker.check_long_path()
            checker.check_stop()
        finally:
            subprocess.run([checker.client, "--stop", checker.binary], env=checker.env,
                           capture_output=True, timeout=60)
    if checker.failures:
        print(f"{len(checker.failures)} failed: " + "; ".join(checker.failures))
        return 1
    print("forked tests behave as tests run alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
