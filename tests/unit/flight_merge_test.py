#!/usr/bin/env python3
"""tools/flight_merge on crafted dumps: agreement, a lagging rank, a rank that enqueued a collective its
stream never started while the others are in it, a mismatch, a missing rank, ranks that failed, and
bad input (malformed JSON, another format, missing fields or fields of another type, several communicators;
with --comm, other communicators' and unreadable dumps passed over) -- each with the
exit status (0 agree, 1 a problem found, 2 bad input) and the words a reader needs, never a
traceback.

  flight_merge_test.py PATH_TO_FLIGHT_MERGE
"""
import json, os, subprocess, sys, tempfile, unittest

MERGE = None  # set from argv


def entry(seq, op="all_gather", count=4096, state="done", start=True, error=None):
    return {"seq": seq, "op": op, "count": count, "in_dtype": "fp32", "out_dtype": "fp32", "reduce_op": None,
            "scale": None, "root": None, "in_place": False, "bytes": count * 4, "algorithm": "direct",
            "stream": "s", "state": state, "enqueue_ns": 1000 * seq, "start_ns": 1000 * seq + 1 if start else None,
            "end_ns": 1000 * seq + 2 if state == "done" else None, "error": error}


def dump(rank, size, entries, comm="comm-a", reason="failure", first_error=None):
    return {"format": "libcomm-flight-recorder", "version": 1, "library_version": "test", "reason": reason,
            "dump_time_ns": 1_700_000_000_000_000_000 + rank, "clock": "CLOCK_REALTIME", "rank": rank,
            "world_size": size, "host": "h", "host_id": "h", "pid": 100 + rank, "job_id": "j", "communicator": comm,
            "members": [], "settings": {}, "last_enqueued_seq": max((e["seq"] for e in entries), default=0),
            "entries_dropped": 0, "first_error": first_error, "entries": entries}


class FlightMerge(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, obj):
        with open(os.path.join(self.dir, name), "w") as fh:
            fh.write(obj if isinstance(obj, str) else json.dumps(obj))

    def merge(self, *args):
        r = subprocess.run([sys.executable, MERGE, *args], capture_output=True, text=True, timeout=60)
        self.assertNotIn("Traceback", r.stderr, r.stderr)
        return r

    def merge_json(self, *args):
        r = self.merge("--json", *args)
        return r.returncode, (json.loads(r.stdout) if r.stdout else None), r.stderr

    def test_agreeing_ranks_exit_0(self):
        for r in range(3):
            self.write(f"c.rank{r}.flight.json", dump(r, 3, [entry(s) for s in (1, 2, 3)]))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 0, err)
        self.assertIsNone(res["first_divergence"])
        self.assertEqual(res["problems"], [])
        self.assertEqual({int(k): v["last_completed"] for k, v in res["ranks"].items()}, {0: 3, 1: 3, 2: 3})
        self.assertIn("the ranks agree", self.merge(self.dir).stdout)

    def test_lagging_rank_named_with_the_first_divergent_seq(self):
        late = [entry(s) for s in (1, 2, 3)] + [entry(4, state="failed")]
        self.write("c.rank0.flight.json", dump(0, 3, late))
        self.write("c.rank1.flight.json", dump(1, 3, [entry(s) for s in (1, 2, 3)], reason="signal"))
        self.write("c.rank2.flight.json", dump(2, 3, late))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err)
        self.assertEqual(res["first_divergence"]["kind"], "lag")
        self.assertEqual(res["first_divergence"]["seq"], 4)
        self.assertEqual(res["first_divergence"]["lagging"], [1])
        text = self.merge(self.dir)
        self.assertEqual(text.returncode, 1)
        self.assertIn("rank(s) 1 never enqueued seq 4 (all_gather, 4096 x fp32); rank(s) 0,2 wait in it", text.stdout)

    def test_ranks_that_failed_are_named_with_their_first_error(self):
        # LIBCOMM_ALGO=eager comm_bench all_gather -b 1M -np 2: both ranks fail seq 1 with the same
        # error; rank 0 had enqueued seq 2 (skipped: the communicator had failed) before it stopped,
        # rank 1 had not. That said "rank(s) 1 never enqueued seq 2 ...; rank(s) 0 wait in it",
        # blaming rank 1 while nobody waits.
        def err(r):
            return f"rank {r}: all_gather seq 1 (262144 x fp32): eager is for at most 16384 bytes per rank"
        self.write("c.rank0.flight.json", dump(0, 2, [entry(1, count=262144, state="failed", error=err(0)),
                                                      entry(2, count=262144, state="skipped", error="skipped")],
                                               first_error=err(0)))
        self.write("c.rank1.flight.json", dump(1, 2, [entry(1, count=262144, state="failed", error=err(1))],
                                               first_error=err(1)))
        rc, res, err_ = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err_)
        self.assertIsNone(res["first_divergence"])
        self.assertEqual(res["ranks"]["0"]["failed"],
                         {"seq": 1, "state": "failed", "collective": "all_gather, 262144 x fp32", "error": err(0)})
        text = self.merge(self.dir)
        self.assertEqual(text.returncode, 1)
        for r in (0, 1):
            self.assertIn(f"rank {r} failed in seq 1 (all_gather, 262144 x fp32): first error: {err(r)}", text.stdout)
        self.assertNotIn("never enqueued", text.stdout)
        self.assertNotIn("wait in it", text.stdout)
        # Every rank failed the same collective and nothing else was enqueued: that is no agreement
        # (it said "the ranks agree", exit 0).
        for r in range(3):
            self.write(f"c.rank{r}.flight.json", dump(r, 3, [entry(1), entry(2, state="failed", error=err(r))],
                                                      first_error=err(r)))
        text = self.merge(self.dir)
        self.assertEqual(text.returncode, 1, text.stdout)
        self.assertNotIn("the ranks agree", text.stdout)
        self.assertIn("rank 2 failed in seq 2 (all_gather, 4096 x fp32): first error: " + err(2), text.stdout)
        # A lag stays a lag: the ranks that timed out waiting in it are listed as failed as well.
        self.write("c.rank2.flight.json", dump(2, 3, [entry(1)], reason="signal"))
        text = self.merge(self.dir)
        self.assertEqual(text.returncode, 1)
        self.assertIn("rank(s) 2 never enqueued seq 2 (all_gather, 4096 x fp32); rank(s) 0,1 wait in it", text.stdout)
        self.assertIn("rank 0 failed in seq 2", text.stdout)
        self.assertNotIn("rank 2 failed", text.stdout)

    def test_rank_that_enqueued_but_never_started_is_named(self):
        # Ranks 0 and 1 are in seq 4 (one failed, one still running); rank 2 called it too, but its
        # stream never reached it. It used to say "the ranks agree" (exit 0), as every rank had it.
        done = [entry(s) for s in (1, 2, 3)]
        self.write("c.rank0.flight.json", dump(0, 3, done + [entry(4, state="failed")]))
        self.write("c.rank1.flight.json", dump(1, 3, done + [entry(4, state="running")], reason="signal"))
        self.write("c.rank2.flight.json", dump(2, 3, done + [entry(4, state="queued", start=False)], reason="signal"))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err)
        self.assertEqual(res["first_divergence"]["kind"], "not_started")
        self.assertEqual(res["first_divergence"]["seq"], 4)
        self.assertEqual(res["first_divergence"]["lagging"], [2])
        text = self.merge(self.dir)
        self.assertEqual(text.returncode, 1)
        self.assertIn("rank(s) 2 enqueued but not started seq 4 (all_gather, 4096 x fp32)", text.stdout)
        self.assertIn("rank(s) 0,1 wait in it since", text.stdout)
        self.assertNotIn("the ranks agree", text.stdout)
        # Every rank queued and none started is no disagreement (a stream behind on every rank).
        for r in range(3):
            self.write(f"c.rank{r}.flight.json", dump(r, 3, done + [entry(4, state="queued", start=False)]))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 0, err)

    def test_mismatch_names_both_calls(self):
        self.write("c.rank0.flight.json", dump(0, 2, [entry(1), entry(2, count=8)]))
        self.write("c.rank1.flight.json", dump(1, 2, [entry(1), entry(2, op="reduce_scatter", count=8)]))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err)
        self.assertEqual(res["first_divergence"]["kind"], "mismatch")
        self.assertEqual(res["first_divergence"]["seq"], 2)
        self.assertIn("rank(s) 0 called all_gather", res["first_divergence"]["text"])
        self.assertIn("rank(s) 1 called reduce_scatter", res["first_divergence"]["text"])

    def test_missing_rank_exit_1_and_named(self):
        for r in (0, 2):
            self.write(f"c.rank{r}.flight.json", dump(r, 4, [entry(1)]))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err)
        self.assertEqual(res["missing"], [1, 3])
        text = self.merge(self.dir).stdout
        self.assertIn("rank 1: no dump", text)
        self.assertIn("rank 3: no dump", text)

    def test_malformed_json_is_a_clear_error(self):
        self.write("c.rank0.flight.json", dump(0, 2, [entry(1)]))
        self.write("c.rank1.flight.json", json.dumps(dump(1, 2, [entry(1)]))[:-40])  # cut short
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("c.rank1.flight.json: malformed JSON at line 1", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_bad_input_exit_2(self):
        cases = {
            "other format": ({"format": "something-else", "version": 1}, "not a libcomm-flight-recorder dump"),
            "newer version": (dict(dump(0, 1, []), version=99), "not a libcomm-flight-recorder dump"),
            "not an object": ([1, 2], "not a JSON object"),
            "no entries": ({k: v for k, v in dump(0, 1, []).items() if k != "entries"}, "field 'entries'"),
            "entry without state": (dump(0, 1, [{k: v for k, v in entry(1).items() if k != "state"}]),
                                    "entry 0 (seq 1) has no 'state'"),
            "rank out of range": (dump(5, 2, []), "rank 5 outside world_size 2"),
        }
        for what, (obj, words) in cases.items():
            with self.subTest(what):
                path = os.path.join(self.dir, "x.flight.json")
                self.write("x.flight.json", obj)
                r = self.merge(path)
                self.assertEqual(r.returncode, 2, r.stdout)
                self.assertIn(words, r.stderr)
        r = self.merge(os.path.join(self.dir, "absent.flight.json"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("absent.flight.json", r.stderr)

    def test_fields_of_the_wrong_type_exit_2(self):
        # Present but of another type: these went on to a traceback (exit 1, read as "divergence").
        cases = {
            "count a list": ({"count": [1]}, "entry 1 (seq 2): 'count' is [1], not an integer"),
            "start_ns a string": ({"start_ns": "5"}, "entry 1 (seq 2): 'start_ns' is \"5\", not an integer or null"),
            "start_ns past int64": ({"start_ns": 10**30}, "entry 1 (seq 2): 'start_ns' is 1000000000000000000000000000000, "
                                                          "not an integer or null (0 to 2^63-1)"),
            "scale a string": ({"scale": "x"}, "entry 1 (seq 2): 'scale' is \"x\", not a number or null"),
            "state null": ({"state": None}, "entry 1 (seq 2): 'state' is null, not a string"),
            "seq true": ({"seq": True}, "entry 1 has no integer 'seq'"),
        }
        for what, (bad, words) in cases.items():
            with self.subTest(what):
                # Rank 1 lags at seq 2, so the merge reads rank 0's seq 2 to describe the lag.
                self.write("c.rank0.flight.json", dump(0, 2, [entry(1), dict(entry(2), **bad)]))
                self.write("c.rank1.flight.json", dump(1, 2, [entry(1)]))
                r = self.merge(self.dir)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn("c.rank0.flight.json: " + words, r.stderr)

    def test_comm_reads_only_that_communicators_dumps(self):
        # The default directory holds every job's dumps: another job's newer-format or broken dump
        # must not stop the merge of the communicator asked for.
        for r in range(2):
            self.write(f"a.rank{r}.flight.json", dump(r, 2, [entry(1)], comm="comm-a"))
        self.write("z.rank0.flight.json", dict(dump(0, 1, [entry(1, count="many")], comm="comm-z"), version=2))
        self.write("cut.rank0.flight.json", json.dumps(dump(0, 1, [entry(1)], comm="comm-y"))[:-40])
        self.write("list.rank0.flight.json", [1, 2])
        rc, res, err = self.merge_json("--comm", "comm-a", self.dir)
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["communicator"], "comm-a")
        self.assertIn("passed over " + os.path.join(self.dir, "cut.rank0.flight.json") + ": malformed JSON", err)
        self.assertIn("passed over " + os.path.join(self.dir, "list.rank0.flight.json") + ": not a dump", err)
        self.assertNotIn("z.rank0", err)  # a readable dump of another communicator is not this one's business
        # Without --comm every file counts; a bad dump of the communicator asked for still fails.
        self.assertEqual(self.merge(self.dir).returncode, 2)
        self.write("a.rank1.flight.json", dict(dump(1, 2, [entry(1)], comm="comm-a"), version=99))
        r = self.merge("--comm", "comm-a", self.dir)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("a.rank1.flight.json: not a libcomm-flight-recorder dump", r.stderr)

    def test_empty_directory_and_several_communicators(self):
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no dumps (*.flight.json) in " + self.dir, r.stderr)
        self.write("a.rank0.flight.json", dump(0, 1, [entry(1)], comm="comm-a"))
        self.write("b.rank0.flight.json", dump(0, 1, [entry(1)], comm="comm-b"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("several communicators", r.stderr)
        self.assertIn("comm-a, comm-b", r.stderr)
        rc, res, err = self.merge_json("--comm", "comm-b", self.dir)
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["communicator"], "comm-b")
        # A --comm that matches nothing says so and lists what is there (was: "no dumps").
        r = self.merge("--comm", "comm-c", self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no dump of communicator comm-c; the dumps are of: comm-a, comm-b", r.stderr)

    def test_dropped_entries_are_not_reported_as_nothing_started(self):
        # Both ranks' recorders kept only seqs 50..52, all still queued: what ran is older than that.
        for rank in (0, 1):
            self.write(f"c.rank{rank}.flight.json",
                       dump(rank, 2, [entry(s, state="queued", start=False) for s in (50, 51, 52)]))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("rank 0: enqueued 52, started before 50, completed before 50", r.stdout)
        self.assertIn("entries before 50 dropped", r.stdout)
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(res["ranks"]["0"]["last_started"], 0)  # --json keeps its numbers


    # Found by a flight-recorder review: each of these misled, hung or printed a traceback.
    def test_dumps_taken_a_moment_apart_are_no_lag(self):
        # kill -USR1 on every rank of a running job: rank 0 dumped at seq 10, rank 1 at seq 12, all
        # done. Rank 1 finished 11 and 12, so rank 0 took part in them.
        self.write("c.rank0.flight.json", dump(0, 2, [entry(s) for s in range(1, 11)], reason="signal"))
        self.write("c.rank1.flight.json", dump(1, 2, [entry(s) for s in range(1, 13)], reason="signal"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("the ranks agree", r.stdout)

    def test_a_lag_seen_in_a_dump_older_than_the_collective_says_so(self):
        # Rank 1's dump is older than rank 0's entry into seq 3 (enqueue_ns 3000 > its dump time 5).
        late = [entry(1), entry(2), entry(3, state="running")]
        self.write("c.rank0.flight.json", dict(dump(0, 2, late), dump_time_ns=10_000))
        self.write("c.rank1.flight.json", dict(dump(1, 2, [entry(1), entry(2)]), dump_time_ns=5))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertIn("rank(s) 1 never enqueued seq 3", r.stdout)
        self.assertIn("were dumped before the others enqueued it", r.stdout)

    def test_garbage_that_would_recurse_or_loop_is_bad_input(self):
        self.write("deep.flight.json", "[" * 100000)
        r = self.merge(os.path.join(self.dir, "deep.flight.json"))
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("nested too deeply", r.stderr)
        self.write("huge.flight.json", dump(0, 10**12, [entry(1)]))
        r = self.merge(os.path.join(self.dir, "huge.flight.json"))
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("world_size 1000000000000 is not in 1..", r.stderr)
        os.remove(os.path.join(self.dir, "deep.flight.json"))
        os.remove(os.path.join(self.dir, "huge.flight.json"))
        # One entry far ahead: seqs are taken as they are, not as a range to walk.
        self.write("c.rank0.flight.json", dump(0, 2, [entry(1), entry(2**40)]))
        self.write("c.rank1.flight.json", dump(1, 2, [entry(1)]))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_a_recorder_turned_off_is_said_not_taken_for_a_lag(self):
        self.write("c.rank0.flight.json", dump(0, 2, [entry(s) for s in (1, 2)]))
        self.write("c.rank1.flight.json", dict(dump(1, 2, []), settings={"capacity": 0}))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertIn("rank 1: its flight recorder is off", r.stdout)
        self.assertNotIn("never enqueued", r.stdout)

    def test_control_characters_are_printed_escaped(self):
        for rank in (0, 1):
            self.write(f"c.rank{rank}.flight.json", dump(rank, 2, [entry(1)], comm="job\x1b[2Jx"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("\x1b", r.stdout)
        self.assertIn("job\\x1b[2Jx", r.stdout)


if __name__ == "__main__":
    MERGE = sys.argv.pop(1)
    unittest.main(verbosity=2)
