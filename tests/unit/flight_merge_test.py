#!/usr/bin/env python3
"""tools/flight_merge on crafted dumps: agreement, a lagging rank, a rank that enqueued a collective its
stream never started while the others are in it, a mismatch, a missing rank (and the collective the
others wait in), ranks that failed, dumps taken a moment apart, several communicators merged each in
turn, output to a reader that went away, and bad input (malformed JSON, another format, missing
fields or fields of another type; with --comm, other communicators' and unreadable dumps passed
over) -- each with the exit status (0 agree, 1 a problem found, 2 bad input, 3 only a lag the dumps'
timing can explain, 141 the reader went away) and the words a reader needs, never a traceback.

  flight_merge_test.py PATH_TO_FLIGHT_MERGE
"""
import json, os, subprocess, sys, tempfile, unittest

MERGE = None  # set from argv


def entry(seq, op="all_gather", count=4096, state="done", start=True, error=None):
    return {"seq": seq, "op": op, "count": count, "in_dtype": "fp32", "out_dtype": "fp32", "reduce_op": None,
            "scale": None, "root": None, "in_place": False, "bytes": count * 4, "algorithm": "direct",
            "stream": "s", "state": state, "enqueue_ns": 1000 * seq, "start_ns": 1000 * seq + 1 if start else None,
            "end_ns": 1000 * seq + 2 if state == "done" else None, "error": error}


T0 = 1_700_000_000_000_000_000  # dump() stamps its dumps about here


def at(t0, entries):
    """`entries` with their times moved from about 0 to about `t0` (ns), next to a dump's time."""
    return [dict(e, **{k: e[k] + t0 for k in ("enqueue_ns", "start_ns", "end_ns") if e[k] is not None}) for e in entries]


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

    def test_a_failure_older_than_the_ring_is_named_by_the_first_errors_seq(self):
        # comm_bench -n 100000 with a peer killed at seq 10: the survivor's ring holds only the
        # collectives queued after it (skipped), 20..23 here. It said "failed before its oldest entry
        # kept"; the recorder keeps the first error's seq outside the ring.
        why = "rank 0: peer rank 1 (pid 7) died during all_gather seq 10 (count 4096 per rank, fp32)"
        queued = [entry(s, state="skipped", start=False, error="skipped") for s in (20, 21, 22, 23)]
        d = dump(0, 2, queued, first_error=why)
        d["first_error_seq"] = 10
        self.write("c.rank0.flight.json", d)
        text = self.merge(self.dir)
        self.assertEqual(text.returncode, 1, text.stderr)
        self.assertIn("rank 0 failed in seq 10 (older than the entries it kept: its ring turned over since): "
                      "first error: " + why, text.stdout)
        rc, res, _ = self.merge_json(self.dir)
        self.assertEqual(res["ranks"]["0"]["failed"]["seq"], 10)
        # A later entry that failed too (a second error) does not stand in for the first.
        d["entries"] = queued[:2] + [entry(22, state="failed", error="later"), queued[3]]
        self.write("c.rank0.flight.json", d)
        self.assertIn("rank 0 failed in seq 10 (older than", self.merge(self.dir).stdout)
        d["entries"] = queued
        # A dump without the field (older libraries) says what it can, as before.
        del d["first_error_seq"]
        self.write("c.rank0.flight.json", d)
        self.assertIn("rank 0 skipped seq 20", self.merge(self.dir).stdout)

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
        self.assertEqual(r.returncode, 0, r.stderr)  # each merged in turn (was: refused, exit 2)
        self.assertEqual(r.stdout.count("the ranks agree"), 2, r.stdout)
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
        self.assertIsNone(res["ranks"]["0"]["last_started"])  # none among those kept: no "before 50" there
        self.assertEqual(res["ranks"]["0"]["oldest"], 50)

    def test_seqs_across_the_wrap_at_2_to_the_32_are_in_order(self):
        # After 2^32 collectives seq 0 follows 2^32 - 1. Rank 0 is in seq 0, rank 1 has not called
        # it: sorted as plain numbers, seq 0 lay before both windows and the ranks "agreed".
        top = 2**32 - 1
        lead = dump(0, 2, [entry(top - 1), entry(top), entry(0, state="running")])
        lag = dump(1, 2, [entry(top - 1), entry(top)])
        for d in (lead, lag):
            d["entries_dropped"] = top - 2  # seqs 1 .. 2^32 - 3 went before the oldest kept
        self.write("c.rank0.flight.json", lead)
        self.write("c.rank1.flight.json", lag)
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("rank(s) 1 never enqueued seq 0 (all_gather, 4096 x fp32); rank(s) 0 wait in it", r.stdout)
        self.assertIn(f"rank 0: enqueued 0, started 0, completed {top}  (failure, entries before {top - 1} dropped)",
                      r.stdout)
        rc, res, _ = self.merge_json(self.dir)
        self.assertEqual(res["first_divergence"]["seq"], 0)
        self.assertEqual(res["ranks"]["0"]["last_enqueued"], 0)
        self.assertEqual(res["ranks"]["0"]["last_completed"], top)
        # A rank that failed in seq 1 after the wrap, its ring turned over since: the first error's
        # seq lies after the wrap, not 2^32 collectives before its entries.
        d = dump(0, 1, [entry(s, state="skipped", start=False, error="skipped") for s in (2, 3)],
                 first_error="rank 0: it broke")
        d["entries_dropped"] = top + 2
        d["first_error_seq"] = 1
        for f in os.listdir(self.dir):
            os.remove(os.path.join(self.dir, f))
        self.write("c.rank0.flight.json", d)
        r = self.merge(self.dir)
        self.assertIn("rank 0 failed in seq 1 (older than the entries it kept", r.stdout)
        d["first_error_seq"] = top  # before the wrap
        self.write("c.rank0.flight.json", d)
        self.assertIn(f"rank 0 failed in seq {top} (older than", self.merge(self.dir).stdout)


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
        self.assertEqual(r.returncode, 3, r.stdout)  # no divergence shown (was 1, "divergence found")
        self.assertIn("rank(s) 1 never enqueued seq 3", r.stdout)
        self.assertIn("were dumped before the others enqueued it", r.stdout)
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 3, err)
        self.assertTrue(res["first_divergence"]["moment_apart"])

    def test_a_rank_dumped_before_what_others_completed_is_not_blamed_for_later_seqs(self):
        # /tmp/review-diag/craft: rank 0 was dumped in seq 1; rank 1 completed seq 1 and 2 and is in
        # seq 3. Seq 2 was excused (rank 1 completed it) but seq 3 was not: "rank(s) 0 never
        # enqueued seq 3", exit 1. The dumps are far apart in time, so only the excuse can clear it.
        self.write("c.rank0.flight.json", dump(0, 2, [entry(1, state="running")], reason="signal"))
        self.write("c.rank1.flight.json", dump(1, 2, [entry(1), entry(2), entry(3, state="running")], reason="signal"))
        r = self.merge(self.dir)
        self.assertNotIn("never enqueued", r.stdout)
        # Nor is it agreement: rank 0's dump says nothing of seq 3, where rank 1 waits (exit 3, as
        # for dumps a moment apart: take them again).
        self.assertEqual(r.returncode, 3, r.stdout)
        self.assertIn("rank(s) 1 wait in seq 3 (all_gather, 4096 x fp32) since 00:00:00.000 UTC; rank(s) 0 were "
                      "dumped before collectives the others completed, so their dumps say nothing of it: take the dumps again to tell", r.stdout)
        # Where nobody waits (rank 1 is done with everything), there is nothing to tell.
        self.write("c.rank1.flight.json", dump(1, 2, [entry(1), entry(2), entry(3)], reason="signal"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("the ranks agree", r.stdout)
        # A rank that did complete what the others did and then never enqueued the next one is still
        # a lag; the rank dumped earlier is not named with it.
        self.write("c.rank0.flight.json", dump(0, 3, [entry(1, state="running")], reason="signal"))
        self.write("c.rank1.flight.json", dump(1, 3, [entry(1), entry(2), entry(3, state="running")], reason="signal"))
        self.write("c.rank2.flight.json", dump(2, 3, [entry(1), entry(2)], reason="signal"))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err)
        self.assertEqual(res["first_divergence"]["lagging"], [2])
        self.assertFalse(res["first_divergence"]["moment_apart"])
        self.assertIn("rank(s) 2 never enqueued seq 3 (all_gather, 4096 x fp32); rank(s) 1 wait in it",
                      self.merge(self.dir).stdout)

    def test_a_dump_stamped_a_moment_after_the_others_entered_is_no_divergence(self):
        # kill -USR1 on every rank of a healthy job, dumps of a library that stamps dump_time_ns
        # after reading the ring: rank 1's ring was read before rank 0 enqueued seq 4, its stamp is
        # 7 ms later. That said "rank(s) 1 never enqueued seq 4 ...", exit 1.
        done = [entry(s) for s in (1, 2, 3)]
        self.write("c.rank0.flight.json", dict(dump(0, 2, at(T0, done + [entry(4, state="running")]), reason="signal"),
                                               dump_time_ns=T0 + 9_000_000))
        self.write("c.rank1.flight.json", dict(dump(1, 2, at(T0, done), reason="signal"), dump_time_ns=T0 + 7_000_000))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 3, r.stdout)
        self.assertIn("rank(s) 1 never enqueued seq 4 (all_gather, 4096 x fp32); rank(s) 0 wait in it", r.stdout)
        self.assertIn("rank(s) 1 were dumped at most 50 ms after the others enqueued it or after their own last "
                      "recorded event: the dumps may just be a moment apart", r.stdout)
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 3, err)
        self.assertEqual(res["first_divergence"]["kind"], "lag")
        self.assertTrue(res["first_divergence"]["moment_apart"])
        # Dumped 2 s after the others entered it: a lag, exit 1, no caveat.
        self.write("c.rank1.flight.json", dict(dump(1, 2, at(T0, done), reason="signal"), dump_time_ns=T0 + 2 * 10**9))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("rank(s) 1 never enqueued seq 4", r.stdout)
        self.assertNotIn("moment apart", r.stdout)
        self.assertNotIn("take the dumps again", r.stdout)
        # The same for a stream a moment behind: rank 1 still runs seq 3, which rank 0 completed, and
        # has seq 4 queued while rank 0 is in it (s8's second communicator said "enqueued but not
        # started", exit 1). Its stream's last event (seq 3's start) is 8 ms before its dump.
        mine = done[:2] + [entry(3, state="running"), entry(4, state="queued", start=False)]
        for late, rc in ((8_000_000, 3), (2 * 10**9, 1)):
            with self.subTest(dumped_after_ns=late):
                self.write("c.rank1.flight.json", dict(dump(1, 2, at(T0, mine), reason="signal"),
                                                       dump_time_ns=T0 + 3_001 + late))
                r = self.merge(self.dir)
                self.assertEqual(r.returncode, rc, r.stdout)
                self.assertIn("rank(s) 1 enqueued but not started seq 4", r.stdout)
                self.assertEqual("the dumps may just be a moment apart" in r.stdout, rc == 3, r.stdout)
        # With a failure or a missing dump as well, that is a problem found: exit 1.
        self.write("c.rank1.flight.json", dict(dump(1, 3, at(T0, done), reason="signal"), dump_time_ns=T0 + 7_000_000))
        self.write("c.rank0.flight.json", dict(dump(0, 3, at(T0, done + [entry(4, state="running")]), reason="signal"),
                                               dump_time_ns=T0 + 9_000_000))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("rank 2: no dump", r.stdout)

    def test_a_rank_without_a_dump_is_named_as_the_one_not_in_the_collective_the_others_wait_in(self):
        # Rank 1 is stopped (SIGSTOP): it writes no dump, and all the merge said was "rank 1: no dump".
        done = [entry(s) for s in (1, 2, 3)]
        for r in (0, 2):
            self.write(f"c.rank{r}.flight.json", dump(r, 3, done + [entry(4, state="running")], reason="signal"))
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err)
        self.assertEqual(res["missing"], [1])
        self.assertEqual(res["first_divergence"]["kind"], "no_dump")
        self.assertEqual(res["first_divergence"]["seq"], 4)
        self.assertEqual(res["first_divergence"]["lagging"], [1])
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertIn("rank 1: no dump", r.stdout)
        self.assertIn("rank(s) 0,2 wait in seq 4 (all_gather, 4096 x fp32) since ", r.stdout)
        self.assertIn("; rank 1, with no dump, is the only rank not shown in it: the suspect", r.stdout)
        # The others timed out in it and failed (their failure dumps): the same, with their failures.
        for r in (0, 2):
            self.write(f"c.rank{r}.flight.json", dump(r, 3, done + [entry(4, state="failed", error="timeout"),
                                                                    entry(5, state="queued", start=False)],
                                                      first_error="timeout"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertIn("rank(s) 0,2 wait in seq 4 (all_gather, 4096 x fp32) since ", r.stdout)
        self.assertIn("rank 0 failed in seq 4 (all_gather, 4096 x fp32): first error: timeout", r.stdout)
        # Several ranks without a dump.
        os.remove(os.path.join(self.dir, "c.rank2.flight.json"))
        r = self.merge(self.dir)
        self.assertIn("rank(s) 0 wait in seq 4", r.stdout)
        self.assertIn("ranks 1,2, with no dump, are the only ranks not shown in it: the suspects", r.stdout)
        # Ranks that are not all in one collective say nothing of the kind.
        self.write("c.rank0.flight.json", dump(0, 3, done, reason="signal"))
        self.write("c.rank2.flight.json", dump(2, 3, done + [entry(4, state="running")], reason="signal"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertNotIn("suspect", r.stdout)

    def test_output_to_a_reader_that_went_away_ends_quietly(self):
        # flight_merge DIR | head -3 ended in a BrokenPipeError traceback.
        for r in range(2):
            self.write(f"c.rank{r}.flight.json", dump(r, 2, [entry(s) for s in (1, 2, 3)]))
        for args in ([self.dir], ["--json", self.dir], ["--help"]):
            with self.subTest(args=args):
                read, write = os.pipe()
                os.close(read)  # the reader is gone before the first line
                try:
                    r = subprocess.run([sys.executable, MERGE, *args], stdout=write, stderr=subprocess.PIPE,
                                       text=True, timeout=60)
                finally:
                    os.close(write)
                self.assertEqual(r.stderr, "")
                # --help too, with buffered output or not (argparse passed over the failed write
                # itself, unbuffered, and exited 0).
                self.assertEqual(r.returncode, 141)

    def test_several_communicators_are_merged_each_in_turn(self):
        # libshard's two communicators of one job dump into one directory: that was refused, exit 2.
        for r in range(2):
            self.write(f"j.c0.rank{r}.flight.json", dump(r, 2, [entry(s) for s in (1, 2)], comm="job.c0"))
        self.write("j.c1.rank0.flight.json", dump(0, 2, [entry(1), entry(2, state="running")], comm="job.c1"))
        self.write("j.c1.rank1.flight.json", dump(1, 2, [entry(1)], comm="job.c1"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        first, second = r.stdout.split("\n\n")
        self.assertTrue(first.startswith("communicator job.c0, 2 ranks\n"), r.stdout)
        self.assertIn("the ranks agree", first)
        self.assertTrue(second.startswith("communicator job.c1, 2 ranks\n"), r.stdout)
        self.assertIn("rank(s) 1 never enqueued seq 2", second)
        rc, res, err = self.merge_json(self.dir)
        self.assertEqual(rc, 1, err)
        self.assertEqual([c["communicator"] for c in res["communicators"]], ["job.c0", "job.c1"])
        self.assertEqual(res["communicators"][1]["first_divergence"]["lagging"], [1])
        # --comm still picks one.
        rc, res, err = self.merge_json("--comm", "job.c0", self.dir)
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["communicator"], "job.c0")
        # The worst status wins: a moment apart (3) over agreement (0), a problem (1) over both.
        self.write("j.c1.rank0.flight.json", dict(dump(0, 2, at(T0, [entry(1), entry(2, state="running")]), comm="job.c1"),
                                                  dump_time_ns=T0 + 5_000_000))
        self.write("j.c1.rank1.flight.json", dict(dump(1, 2, at(T0, [entry(1)]), comm="job.c1"), dump_time_ns=T0 + 4_000_000))
        self.assertEqual(self.merge(self.dir).returncode, 3)
        os.remove(os.path.join(self.dir, "j.c0.rank1.flight.json"))
        self.assertEqual(self.merge(self.dir).returncode, 1)
        # Bad input in either is bad input: exit 2, nothing merged.
        self.write("j.c0.rank1.flight.json", dump(1, 3, [entry(1)], comm="job.c0"))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertEqual(r.stdout, "")
        self.assertIn("disagree on world_size: [2, 3] (communicator job.c0)", r.stderr)

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
        # One entry far ahead: the library's seqs are 32 bits; nothing is a range to walk.
        self.write("c.rank0.flight.json", dump(0, 2, [entry(1), entry(2**40)]))
        self.write("c.rank1.flight.json", dump(1, 2, [entry(1)]))
        r = self.merge(self.dir)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("entry 1: seq 1099511627776 is not a 32-bit seq", r.stderr)
        self.write("c.rank0.flight.json", dump(0, 2, [entry(1), entry(2**32 - 1)]))
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
