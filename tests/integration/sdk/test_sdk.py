#!/usr/bin/env python3
"""The installable SDK, used the way docs/embedding.md tells a new user to use it.

1. `cmake --install` of the build into a temporary prefix: libraries, headers, CMake package,
   pkg-config file, the weft binary.
2. Every public header (cmake/public_headers.txt) compiles on its own against the installed
   package (one translation unit per header, found with a plain find_package(weft)).
3. examples/ configured and built out of tree with find_package(weft); one example also built
   with pkg-config alone.
4. Each example runs: the judge pipeline (a worker killed mid-run, every question judged, the
   worker restarted), batch inference (killed mid-run, resumed without redoing a finished line,
   results in input order), the tensor receiver (bytes pulled over UCX between two processes,
   checksums equal), the user's own chaos tests with weft::testing (a node killed under a
   supervised actor; `weft chaos` invariants against a `weft serve` the fixture started).
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def check(cond, what):
    if not cond:
        print("FAIL:", what, flush=True)
        sys.exit(1)
    print("ok:", what, flush=True)


def install(build, prefix):
    run(["cmake", "--install", str(build), "--prefix", str(prefix)], stdout=subprocess.DEVNULL)
    for rel in ["bin/weft", "lib/libweft_schema.a", "lib/libweft_gpu.a", "lib/libweft_transport.a",
                "lib/libweft_actors.a", "lib/cmake/weft/weftConfig.cmake",
                "lib/cmake/weft/weftConfigVersion.cmake", "lib/cmake/weft/weftTargets.cmake",
                "lib/pkgconfig/weft.pc", "include/weft/schema/control.capnp.h",
                "include/weft/schema/control.capnp", "include/weft/actors/node.hpp",
                "lib/libweft_testing.a", "lib/cmake/weft/weftTestingTargets.cmake",
                "include/weft/testing/chaos.hpp", "share/weft/scripts/plot_chaos.py"]:
        check((prefix / rel).exists(), f"installed {rel}")
    # Headers that include what only weft's own sources may see are not installed.
    check(not (prefix / "include/weft/actors/serve/http_queue.hpp").exists(),
          "internal http_queue.hpp not installed")
    check(not list((prefix / "include/weft/gpu").rglob("*.cuh")), "no CUDA kernel headers installed")


def public_headers(source):
    lines = (source / "cmake/public_headers.txt").read_text().splitlines()
    return [l.strip() for l in lines if l.strip() and not l.startswith("#")]


def headers_compile_alone(source, prefix, work):
    proj = work / "headers"
    proj.mkdir()
    names = []
    for i, h in enumerate(public_headers(source)):
        tu = proj / f"h{i}.cpp"
        tu.write_text(f"#include <weft/{h}>\n")
        names.append(tu.name)
    (proj / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.25)\nproject(headers LANGUAGES C CXX)\n"
        "set(CMAKE_CXX_STANDARD 20)\nfind_package(weft REQUIRED COMPONENTS testing)\n"
        f"add_library(headers OBJECT {' '.join(names)})\n"
        "target_link_libraries(headers PRIVATE weft::testing)\n")
    run(["cmake", "-S", str(proj), "-B", str(proj / "build"), "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={prefix}"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", str(proj / "build"), "-j2"], stdout=subprocess.DEVNULL)
    check(True, f"{len(names)} public headers compile on their own")


def build_examples(source, prefix, work):
    build = work / "examples"
    run(["cmake", "-S", str(source / "examples"), "-B", str(build), "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={prefix}"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", str(build), "-j2"], stdout=subprocess.DEVNULL)
    # The same program from pkg-config alone (no CMake).
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib/pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "weft"], env=env, check=True,
                           capture_output=True, text=True).stdout.split()
    exe = work / "batch_jsonl_pkgconfig"
    run(["c++", str(source / "examples/batch_jsonl/main.cpp"), "-o", str(exe)] + flags)
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    check("--input" in out, "the pkg-config build runs")
    return build


def judge_pipeline(build, model):
    p = subprocess.run([str(build / "judge_pipeline/judge_pipeline"), "--model", str(model),
                        "--workers", "2", "--questions", "4", "--kill-after", "2"],
                       capture_output=True, text=True, timeout=300)
    print(p.stdout[-2000:])
    check(p.returncode == 0, f"judge_pipeline exits 0 (got {p.returncode}; stderr tail: "
          f"{p.stderr[-1500:]})")
    check("4/4 questions judged, 0 errors" in p.stdout, "every question judged")
    check("was killed and restarted; 2/2 workers ready" in p.stdout, "the killed worker came back")
    bad = subprocess.run([str(build / "judge_pipeline/judge_pipeline"), "--workers", "0"],
                         capture_output=True, text=True, timeout=30)
    check(bad.returncode == 2 and "at least 1" in bad.stderr, "bad option refused")


def read_jsonl(path):
    return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines() if l.strip()]


def batch_jsonl(build, model, work):
    exe = str(build / "batch_jsonl/batch_jsonl")
    n = 300
    inp = work / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"Count to {i}.", "max_tokens": 24}) + "\n"
                           for i in range(n)))
    out = work / "out.jsonl"
    journal = pathlib.Path(str(out) + ".journal")
    args = [exe, "--input", str(inp), "--output", str(out), "--model", str(model),
            "--workers", "2", "--concurrency", "2"]
    # Killed once enough lines are finished.
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_text().count("\n") >= 20:
            break
        time.sleep(0.01)
    check(proc.poll() is None, "batch run still going when killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {}
    for l in journal.read_text().splitlines(keepends=True):
        if l.endswith("\n"):
            r = json.loads(l)
            before[r["line"]] = r
    check(20 <= len(before) < n, f"{len(before)} lines journaled before the kill")
    check(not out.exists(), "no output file from the killed run")
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    check(p.returncode == 0, f"resumed run exits 0 (stderr tail: {p.stderr[-1500:]})")
    check(f"resuming: {len(before)} of {n} lines already done" in p.stderr, "resume announced")
    check(f"({len(before)} resumed, {n - len(before)} generated)" in p.stderr,
          "only the unfinished lines were generated")
    rows = read_jsonl(out)
    check([r["line"] for r in rows] == list(range(n)), "every line once, in input order")
    check(all(rows[i] == r for i, r in before.items()), "journaled lines kept as they were")
    check(all(r["prompt"] == f"Count to {r['line']}." for r in rows), "results match their prompts")
    check(not journal.exists(), "journal removed when done")
    # Bad input: a clear error naming the line, nothing started.
    bad = work / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    p = subprocess.run([exe, "--input", str(bad), "--output", str(work / "bad-out.jsonl")],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "bad.jsonl:2" in p.stderr, "malformed input line named")


def tensor_receiver(build):
    exe = build / "tensor_receiver/tensor_receiver"
    if not exe.exists():
        return
    try:
        p = subprocess.run([str(exe), "--tensors", "4", "--mib", "8"], capture_output=True,
                           text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        # Say how far it got: the transfers, or the shutdown after them.
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        check(False, f"tensor_receiver finishes within 180 s (stdout: {out[-1500:]!r}; "
                     f"stderr: {err[-1500:]!r})")
        return
    print(p.stdout[-2000:])
    check(p.returncode == 0, f"tensor_receiver exits 0 (stderr tail: {p.stderr[-1500:]})")
    check("4/4 tensors received, checksums equal" in p.stdout, "every tensor arrived intact")


def chaos_gtest(build, prefix, model):
    """Example 4: the user's own GoogleTest chaos tests with weft::testing."""
    env = dict(os.environ, WEFT_BINARY=str(prefix / "bin/weft"), WEFT_MODEL=str(model))
    p = subprocess.run([str(build / "chaos_gtest/chaos_gtest")], capture_output=True, text=True,
                       timeout=600, env=env)
    print(p.stdout[-3000:])
    check(p.returncode == 0, f"chaos_gtest passes (stderr tail: {p.stderr[-1500:]})")
    check("[  PASSED  ] 2 tests" in p.stdout, "both of its tests ran and passed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, type=pathlib.Path)
    ap.add_argument("--source", required=True, type=pathlib.Path)
    ap.add_argument("--make-tiny-model", required=True)
    a = ap.parse_args()
    if shutil.which("pkg-config") is None:
        print("pkg-config is missing (scripts/setup.sh --test installs it)")
        return 1
    with tempfile.TemporaryDirectory(prefix="weft-sdk-") as tmp:
        work = pathlib.Path(tmp)
        prefix = work / "prefix"
        install(a.build, prefix)
        headers_compile_alone(a.source, prefix, work)
        build = build_examples(a.source, prefix, work)
        model = work / "tiny.gguf"
        run([a.make_tiny_model, str(model)], stdout=subprocess.DEVNULL)
        judge_pipeline(build, model)
        batch_jsonl(build, model, work)
        tensor_receiver(build)
        chaos_gtest(build, prefix, model)
    print("sdk: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
