"""Chaos: SIGKILL engine worker processes of `weft serve` during a load run.

Colocated (--workers 2): the busiest worker is killed twice. Disaggregated (--prefill 1
--decode 1): the decode worker is killed, then the prefill worker. Hang (--workers 2): the busiest
worker is SIGSTOPped with the head's heartbeat timeout and CAF's connection timeout far away, so
only the router's stall detection (--stall-ms) can notice: its requests must migrate and its
process must be killed and relaunched.

Pool (--workers 2 --cache-shards 1): as colocated, with the running sequences' KV (prompt and
generated tokens) checkpointed to the prefix-cache pool: every migrated sequence must take its
checkpointed KV from the pool (weft_migration_pool_tokens_total) instead of recomputing it.

Every accepted request must complete with exactly the tokens of an undisturbed greedy run (no
token missing or duplicated across the migration), no KV block may stay referenced afterwards, and
the killed worker must come back and take work again. Prints the measured recovery times.

Usage: test_serve_chaos.py --weft PATH/TO/weft [--topology colocated|disaggregated|hang|pool]
       (exit 77 = skipped: no model)
"""
import concurrent.futures
import json
import os
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from weft_serve import WeftServer, parse_test_args, report_failures  # noqa: E402

N_REQUESTS = 12
MAX_TOKENS = 64


def stream_completion(url, prompt, max_tokens):
    """Streams one greedy completion over raw HTTP; returns (text, finish_reason, n_chunks, error)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "logprobs": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    text, finish, tokens, error = "", None, [], None
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                error = ev["error"]["message"]
                continue
            ch = ev["choices"][0]
            text += ch["text"]
            if ch.get("logprobs"):
                tokens += ch["logprobs"]["tokens"]
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    return text, finish, tokens, error


def run_load(url, prompts):
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: stream_completion(url, p, MAX_TOKENS), prompts))


def workers(srv):
    return srv.admin()["router"]["workers"]


def wait_workers(srv, n, timeout_s=60):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if len(workers(srv)) >= n:
            return True
        time.sleep(0.2)
    return False


def kill_busy_worker(srv, min_tokens_before_kill, progress, role=None, sig=signal.SIGKILL):
    """Waits until the load has produced some tokens (and a worker of `role` has requests in
    flight), then SIGKILLs the worker process of that role with the most in-flight requests.
    Returns (worker, time of the kill)."""
    deadline = time.time() + 60
    ws = []
    while time.time() < deadline:
        if progress() >= min_tokens_before_kill:
            ws = [w for w in workers(srv) if role is None or w["role"] == role]
            # A decode worker is killed once it holds several sequences (they all migrate).
            if ws and max(w["inflight"] for w in ws) >= (4 if role == "decode" else 1):
                break
        time.sleep(0.05)
    if not ws:
        ws = [w for w in workers(srv) if role is None or w["role"] == role]
    # The victim is chosen from the snapshot that met the condition: asking the router again
    # could find a prefill worker that has just handed its last request on.
    victim = max(ws, key=lambda w: w["inflight"])
    os.kill(victim["pid"], sig)
    return victim, time.time()


def busiest_worker_steps(srv):
    """A progress function: the engine steps, since now, of the worker that holds the most
    requests when it is called (all of them if that worker has restarted since)."""
    start = {w["name"]: (w["pid"], w["steps"]) for w in workers(srv)}

    def progress():
        ws = workers(srv)
        if not ws:
            return 0
        w = max(ws, key=lambda w: w["inflight"])
        pid, steps = start.get(w["name"], (None, 0))
        return w["steps"] - (steps if pid == w["pid"] else 0)
    return progress


def pool_tokens(srv):
    """weft_migration_pool_tokens_total per worker."""
    return {dict(labels).get("worker"): v for (n, labels), v in srv.metrics().items()
            if n == "weft_migration_pool_tokens_total"}


def main():
    args, _ = parse_test_args(lambda ap: ap.add_argument(
        "--topology", choices=["colocated", "disaggregated", "hang", "pool"], default="colocated"))
    if args is None:
        return 77
    prompts = ["Request %d: write about the number %d." % (i, i * 7) for i in range(N_REQUESTS)]
    # Killing a prefill worker needs prefills in flight for more than an instant: that round uses
    # prompts of some 200 tokens the server has not seen (none is in a prefix cache); their
    # undisturbed reference is taken after the round, on the recovered server.
    filler = " ".join("Item %d weighs %d grams." % (k, (k * k) % 97) for k in range(25))
    long_prompts = ["Request %d: write about the number %d after this list. %s" % (i, i * 7, filler)
                    for i in range(N_REQUESTS)]
    failures = []

    def compare(round_no, results, reference):
        for i, ((text, finish, toks, err), (rtext, rfinish, rtoks, rerr)) in enumerate(zip(results, reference)):
            if rerr is not None or rfinish != "length" or len(rtoks) != MAX_TOKENS:
                failures.append("round %d request %d: the undisturbed run failed (%s, finish %s, %d tokens)" %
                                (round_no, i, rerr, rfinish, len(rtoks)))
            elif err is not None:
                failures.append("round %d request %d failed: %s" % (round_no, i, err))
            elif toks != rtoks or text != rtext:
                failures.append("round %d request %d differs from the undisturbed run (%d vs %d tokens)" %
                                (round_no, i, len(toks), len(rtoks)))
            elif finish != "length":
                failures.append("round %d request %d finish %s" % (round_no, i, finish))
    sig = signal.SIGKILL
    kill_after_steps = 3
    if args.topology == "colocated":
        topology, victims = ["--workers", "2"], [None, None]
    elif args.topology == "pool":
        # Segments of 16 tokens; killed once every sequence holds two whole segments or more:
        # after 30 steps of the victim itself (prompts of ~12 tokens, one token a step). The sum
        # over both workers is no measure of that: a restarted worker may take most of a round's
        # requests while the other races through steps of one sequence.
        topology, victims = ["--workers", "2", "--cache-shards", "1", "--segment-tokens", "16"], [None, None]
        kill_after_steps = 30
    elif args.topology == "hang":
        # The head would notice a stopped process after --dead-after-ms without heartbeats, CAF
        # after its connection timeout: push both out of reach (the stall limit is 4x the
        # workers' step bound when that exceeds --stall-ms: ~28 s on one Zen 1 core).
        topology, victims = ["--workers", "2", "--stall-ms", "3000", "--connection-timeout-ms", "120000",
                             "--dead-after-ms", "600000"], [None]
        sig = signal.SIGSTOP
    else:
        topology, victims = ["--prefill", "1", "--decode", "1"], ["decode", "prefill"]
    with WeftServer(args.weft, topology + ["--max-running", "16", "--kv-blocks", "512"]) as srv:
        reference = run_load(srv.url, prompts)
        for i, (text, finish, toks, err) in enumerate(reference):
            assert err is None and finish == "length" and len(toks) == MAX_TOKENS, (i, finish, err, len(toks))

        for round_no, role in enumerate(victims):
            round_prompts = long_prompts if role == "prefill" else prompts

            def counting(i, p):
                # Killing a prefill worker needs prefills in flight: spread the arrivals out.
                if role == "prefill":
                    time.sleep(0.25 * i)
                return stream_completion(srv.url, p, MAX_TOKENS)

            # Progress = generated tokens so far, read from the server's metrics.
            gen_before = srv.metric_sum("weft_worker_steps_total")
            progress = lambda: srv.metric_sum("weft_worker_steps_total") - gen_before
            if args.topology == "pool":
                progress = busiest_worker_steps(srv)
            migrations_before = srv.metric_sum("weft_router_migrations_total")
            pool_before = pool_tokens(srv)
            with concurrent.futures.ThreadPoolExecutor(N_REQUESTS + 1) as pool:
                futures = [pool.submit(counting, i, p) for i, p in enumerate(round_prompts)]
                victim, killed_at = kill_busy_worker(srv, kill_after_steps, progress, role, sig)
                results = [f.result() for f in futures]
            done_at = time.time()
            print("round %d: killed %s (%s, pid %d, %d in flight); load finished %.1f s after the kill" %
                  (round_no, victim["name"], victim["role"], victim["pid"], victim["inflight"], done_at - killed_at))
            if round_prompts is prompts:
                compare(round_no, results, reference)
            m = srv.metrics()
            resume_n = sum(v for (n, _), v in m.items() if n == "weft_migration_resume_seconds_count")
            resume_s = sum(v for (n, _), v in m.items() if n == "weft_migration_resume_seconds_sum")
            migrations = sum(v for (n, _), v in m.items() if n == "weft_router_migrations_total") - migrations_before
            print("round %d: %d migrations in this round; mean kill-to-first-resumed-token %.3f s over %d sequences" %
                  (round_no, migrations, resume_s / resume_n if resume_n else float("nan"), resume_n))
            if migrations < 1:
                failures.append("round %d: no request was migrated (the victim had none in flight?)" % round_no)
            if args.topology == "pool":
                # The survivor's load reports carry its counter: wait for one that has the
                # migrated sequences' reads (a fixed 1 s was sometimes one report short).
                before = sum(v for w, v in pool_before.items() if w != victim["name"])
                deadline = time.time() + 6.0
                while True:
                    time.sleep(0.5)
                    after = pool_tokens(srv)
                    survivor = sum(v for w, v in after.items() if w != victim["name"])
                    if survivor - before >= 16 * migrations or time.time() > deadline:
                        break
                print("round %d: migrated sequences took %d tokens of KV from the pool" % (round_no, survivor - before))
                if survivor - before < 16 * migrations:
                    failures.append("round %d: %d migrated sequences took only %d tokens of KV from the pool "
                                    "(each had at least one 16-token segment checkpointed)" %
                                    (round_no, migrations, survivor - before))
            if sig == signal.SIGSTOP:
                hung = sum(v for (n, _), v in m.items() if n == "weft_router_hung_workers_total")
                if hung < 1:
                    failures.append("round %d: the stopped worker was not detected as hung" % round_no)
                limit = [v for (n, _), v in m.items() if n == "weft_router_stall_limit_seconds"]
                print("round %d: stall limit %s s" % (round_no, limit), flush=True)
                if len(limit) != 1 or limit[0] < 3.0:
                    failures.append("round %d: weft_router_stall_limit_seconds %s, not >= --stall-ms" %
                                    (round_no, limit))
            used = srv.wait_kv_free()
            if used != 0:
                failures.append("round %d: %d KV blocks still referenced after the run" % (round_no, used))
            # The supervisor restarts the worker; it takes work again once loaded.
            t0 = time.time()
            if not wait_workers(srv, 2):
                failures.append("round %d: the killed worker did not come back" % round_no)
            else:
                print("round %d: 2 workers ready again %.1f s after the load finished" % (round_no, time.time() - t0))
            if round_prompts is long_prompts:
                compare(round_no, results, run_load(srv.url, long_prompts))
        # Both workers serve: a burst spreads over them and matches the reference.
        # A worker served if it prefilled or decoded some of the burst (a prefill worker of the
        # disaggregated topology only prefills).
        def work(w):
            return w["decode_tokens"] + w["prefill_tokens"]
        decoded_before = {w["name"]: work(w) for w in workers(srv)}
        again = run_load(srv.url, prompts)
        for i, (text, finish, toks, err) in enumerate(again):
            if err is not None or toks != reference[i][2]:
                failures.append("after recovery request %d: %s" % (i, err or "differs"))
        now = workers(srv)
        busy = [w for w in now if work(w) > decoded_before.get(w["name"], 0)]
        print("after recovery: %d of %d workers served the last burst" % (len(busy), len(now)))
        if len(now) < 2 or len(busy) != len(now):
            failures.append("after recovery only %d of %d workers served the burst" % (len(busy), len(now)))
    return report_failures(failures, srv)


if __name__ == "__main__":
    sys.exit(main())
