#!/usr/bin/env python3
"""`weft train --remote-trainers`: a trainer group with a rank on another host (docs/training.md,
"Trainer groups across hosts"). The other host is a network namespace joined to this one by a veth
pair: its `weft node --join` process reaches the head and the coordinator only at the address
`--bind` names, and the ranks' all-reduce runs over UCX's TCP transport across the link. The run
gives the same bits as the group on one host, also when the other host has neither the model nor
the data (rank 0 sends them; a later run finds the copy); a group whose remote node never joins
ends with a clear error after --join-timeout-s; the options are checked. Needs root (network namespaces):
reported as skipped (exit 77) otherwise.
"""
import argparse
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "support"))
from cli_checks import check, finish, run_weft  # noqa: E402


def ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip"] + list(args)
    subprocess.run(cmd, check=True, capture_output=True)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("skipped: network namespaces need root")
        return 77
    tag = f"wtr{os.getpid() % 100000}"
    ns, host_if, ns_if = tag, tag + "h", tag + "n"
    net = 10 + os.getpid() % 200
    host_ip, ns_ip = f"10.215.{net}.1", f"10.215.{net}.2"
    try:
        ip("netns", "add", ns)
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", host_ip + "/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", ns_ip + "/24", "dev", ns_if, ns=ns)
        ip("link", "set", ns_if, "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        print(f"skipped: cannot create a network namespace ({e})")
        return 77
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run(a, tmp, ns, host_if, ns_if, host_ip, ns_ip)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    return finish()


def run(a, tmp, ns, host_if, ns_if, host_ip, ns_ip):
    weft = a.weft
    files = os.path.join(tmp, "files")  # the model and the data (hidden from the other host)
    os.makedirs(files)
    model = os.path.join(files, "tiny.gguf")
    subprocess.run([a.make_model, model], check=True, capture_output=True)
    data = os.path.join(files, "d.jsonl")
    with open(data, "w") as f:
        for i in range(64):
            f.write(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n")
    secret = os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write("a-secret-the-two-hosts-share-0123\n")
    os.chmod(secret, 0o600)
    common = ["--model", model, "--data", data, "--batch-tokens", "256", "--seed", "3",
              "--threads", "1", "--trainers", "2"]
    base = common + ["--steps", "6"]

    remote_cache = os.path.join(tmp, "other-host-cache")  # its $WEFT_CACHE_DIR

    def other_host(port, hide=(), log=None):
        """The other host's `weft node`, in the namespace, joining this host's head; `hide`:
        directories it sees empty (a tmpfs over each in a mount namespace of its own); `log`: a
        file for what it logs."""
        node = [weft, "node", "--join", f"{host_ip}:{port}", "--roles", "trainer",
                "--secret-file", secret, "--transport", "ucx", "--ucx-tls", "tcp",
                "--transport-param", f"ucx.net_devices={ns_if}", "--bind", ns_ip, "--node-id",
                "other-host"]
        cmd = ["ip", "netns", "exec", ns] + node
        if hide:
            mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(h)}" for h in hide)
            cmd = ["ip", "netns", "exec", ns, "unshare", "-m", "--propagation", "private", "sh",
                   "-c", mounts + " && exec " + " ".join(shlex.quote(x) for x in node)]
        out = log if log else subprocess.DEVNULL
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, WEFT_CACHE_DIR=remote_cache))

    def node_log(name):
        return open(os.path.join(tmp, name), "w+")

    def read(log):
        log.seek(0)
        return log.read()

    def remote_train(port, extra, log):
        """`weft train` with one rank on the other host."""
        return subprocess.Popen(
            [weft, "train"] + extra + [
                "--remote-trainers", "1", "--bind", host_ip, "--head-port", str(port),
                "--secret-file", secret, "--ucx-tls", "tcp", "--ucx-net-devices", host_if],
            stdout=log, stderr=subprocess.STDOUT)

    def finish(train, node, log, kill_node=False):
        """Waits for `weft train` (and the other host's node, which stops with its head; killed
        first with kill_node); returns its exit code and what it logged."""
        if kill_node:
            node.kill()
            node.wait()
        try:
            rc = train.wait(timeout=300)
        except subprocess.TimeoutExpired:
            train.kill()
            rc = -1
        if not kill_node:
            try:
                node.wait(timeout=20)
            except subprocess.TimeoutExpired:
                node.kill()
        log.seek(0)
        return rc, log.read()

    # The reference: both ranks on this host.
    local = os.path.join(tmp, "local.gguf")
    rc, out = run_weft(weft, "train", base + ["--checkpoint-dir", os.path.join(tmp, "c1"),
                                              "--save", local], 240)
    check(rc == 0, f"two local trainers (rc {rc}): {out[-300:]}")

    # Rank placement is the head's (least loaded): one rank on each node.
    port = free_port(host_ip)
    remote = os.path.join(tmp, "remote.gguf")
    log = open(os.path.join(tmp, "train.log"), "w+")
    train = remote_train(port, base + ["--join-timeout-s", "60", "--checkpoint-dir",
                                       os.path.join(tmp, "c2"), "--save", remote], log)
    deadline = time.time() + 60
    said = ""
    while time.time() < deadline and "weft node --join" not in said:
        time.sleep(0.2)
        log.seek(0)
        said = log.read()
    check("weft node --join" in said and f"{host_ip}:{port}" in said,
          f"weft train says how the other host joins: {said[-300:]}")
    nlog = node_log("node-1.log")
    node = other_host(port, hide=[files], log=nlog)
    rc, said = finish(train, node, log)
    check(rc == 0 and "2 of 2 trainer nodes have joined" in said and "on other-host" in said,
          f"a rank on the other host (rc {rc}): {said[-400:]}")
    check(rc == 0 and os.path.exists(remote) and sha(remote) == sha(local),
          "the same bits as the group on one host")
    # The other host had neither file: rank 0 sent both, kept by content in its cache.
    got = sorted(os.listdir(os.path.join(remote_cache, "received")))
    said = read(nlog)
    check("the model at" in said and "the data at" in said and "receiving it" in said,
          f"the other host receives the model and the data from rank 0: {said[-600:]}")
    check(len(got) == 2 and any(n.endswith("-tiny.gguf") for n in got)
          and any(n.endswith("-d.jsonl") for n in got),
          f"... and keeps them in $WEFT_CACHE_DIR/received: {got}")
    for n in got:
        src = model if n.endswith(".gguf") else data
        check(sha(os.path.join(remote_cache, "received", n)) == sha(src),
              f"... with rank 0's bytes ({n})")

    # The other host dies mid-run (SIGKILL of its node): the group restarts from the last
    # checkpoint on the live node (both ranks there now) and ends with the same bits as an
    # undisturbed run.
    long = ["--steps", "1500", "--checkpoint-every", "100"]
    base = common
    ref = os.path.join(tmp, "ref-long.gguf")
    rc, out = run_weft(weft, "train", base + long + ["--checkpoint-dir", os.path.join(tmp, "c3"),
                                                     "--save", ref], 400)
    check(rc == 0, f"the undisturbed long run (rc {rc}): {out[-200:]}")
    port = free_port(host_ip)
    killed = os.path.join(tmp, "killed.gguf")
    ck = os.path.join(tmp, "c4")
    log = open(os.path.join(tmp, "train-kill.log"), "w+")
    train = remote_train(port, base + long + ["--allreduce-timeout-ms", "5000",
                                              "--checkpoint-dir", ck, "--save", killed], log)
    time.sleep(1.0)
    node = other_host(port)
    deadline = time.time() + 120
    while time.time() < deadline and train.poll() is None and not (
            os.path.isdir(ck) and any(n.endswith(".ckpt") for n in os.listdir(ck))):
        time.sleep(0.05)
    was_running = train.poll() is None
    rc, said = finish(train, node, log, kill_node=True)
    check(was_running and rc == 0 and "trainer group 2 formed" in said,
          f"SIGKILL of the other host's node: the group restarts on the live node (rc {rc}): "
          f"{said[-400:]}")
    check(rc == 0 and sha(killed) == sha(ref), "... and ends with the undisturbed run's bits")

    # No shared storage: the other host sees the checkpoint directory empty. SIGTERM mid-run →
    # rank 0 (here: only this host's nodes take rank 0) checkpoints; --resume with the other host
    # joined again → rank 0 sends its checkpoint to rank 1 over the group, and the run ends with
    # the undisturbed run's bits.
    ck5 = os.path.join(tmp, "c5")
    os.makedirs(ck5)
    out5 = os.path.join(tmp, "resumed.gguf")
    said = []
    for resume in (False, True):
        port = free_port(host_ip)
        log = open(os.path.join(tmp, f"train-{resume}.log"), "w+")
        train = remote_train(port, base + long + ["--checkpoint-dir", ck5, "--save", out5] +
                             (["--resume"] if resume else []), log)
        time.sleep(1.0)
        nlog = node_log(f"node-{resume}.log")
        node = other_host(port, hide=[ck5, files], log=nlog)
        if not resume:
            deadline = time.time() + 120
            while time.time() < deadline and train.poll() is None and not any(
                    n.endswith(".ckpt") for n in os.listdir(ck5)):
                time.sleep(0.05)
            train.send_signal(signal.SIGTERM)
        said.append(finish(train, node, log))
        said.append(read(nlog))
    (rc1, log1), node1, (rc2, log2), node2 = said
    check(rc1 == 143 and rc2 == 0 and "trainer-1 role trainer on other-host" in log2,
          f"SIGTERM, then --resume with a rank on a host without the checkpoints (rc {rc1}, "
          f"{rc2}): {log2[-300:]}")
    check(rc2 == 0 and sha(out5) == sha(ref), "... rank 0 sends the checkpoint: the same bits")
    check("received from rank 0 earlier" in node1 + node2 and "receiving it" not in node1 + node2,
          f"a later run on the other host uses the copies it received before: {node2[-400:]}")

    # A node that never joins: a clear error after the timeout, nothing left running.
    base = common + ["--steps", "6"]
    rc, out = run_weft(weft, "train", base + ["--remote-trainers", "1", "--bind", host_ip,
                                              "--secret-file", secret, "--join-timeout-s", "2"],
                       120)
    check(rc == 1 and "only 1 of 2 trainer nodes joined" in out,
          f"--join-timeout-s ends a group whose remote node never came (rc {rc}): {out[-200:]}")
    rc, out = run_weft(weft, "train", base + ["--remote-trainers", "1", "--bind", host_ip])
    check(rc == 2 and "--secret-file" in out, f"--remote-trainers without a secret (rc {rc})")
    rc, out = run_weft(weft, "train", base + ["--bind", host_ip])
    check(rc == 2 and "need --remote-trainers" in out, f"--bind alone is refused (rc {rc})")


if __name__ == "__main__":
    sys.exit(main())
