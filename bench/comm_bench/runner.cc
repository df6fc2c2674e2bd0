#include "runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.h"
#include "device.h"

namespace comm_bench {

using libcomm::DataType;
using libcomm::dataTypeSize;
using libcomm::Deadline;
using libcomm::Status;

namespace {

// Bytes of slack after every buffer: room for the check's guard elements and for count rounding.
constexpr size_t kSlackBytes = 4096;
// One exchange slot per rank, doubles: out-of-place time, in-place time, the two wrong counts and
// the two output digests (all_reduce).
constexpr size_t kSlotDoubles = 6;
constexpr size_t kSlotFloats = kSlotDoubles * 2;

size_t roundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

std::string rowName(const Row& row, bool inPlace) {
  std::string types = typeName(row.types.in);
  if (row.types.out != row.types.in) types += std::string(">") + typeName(row.types.out);
  return libcomm::detail::strCat(collName(row.coll), " ", types,
                                 reduces(row.coll) ? std::string(" ") + opName(row.op) : "", " size ", row.bytes,
                                 " count ", row.count, inPlace ? " in-place" : " out-of-place");
}

}  // namespace

std::vector<Row> planRows(const Options& options, Coll coll, int nranks) {
  std::vector<Row> rows;
  const std::vector<libcomm::ReduceOp> sumOnly{libcomm::ReduceOp::kSum};
  const auto& ops = reduces(coll) ? options.ops : sumOnly;
  for (const TypePair& types : typePairs(options, coll)) {
    for (auto op : ops) {
      for (size_t size : sizeList(options)) {
        Row row;
        row.coll = coll;
        row.types = types;
        row.op = op;
        // all_reduce's size is one buffer; the others' is nranks chunks of count elements.
        const size_t chunks = coll == Coll::kAllReduce ? 1 : static_cast<size_t>(nranks);
        row.count = size / (chunks * dataTypeSize(types.in));
        row.bytes = chunks * row.count * dataTypeSize(types.in);
        // Planned placements; runRow() fills in the measurements.
        row.outOfPlace.ran = true;
        row.inPlace.ran = types.in == types.out;
        rows.push_back(row);
      }
    }
  }
  return rows;
}

Runner::Runner(const Options& options, libcomm::Communicator& comm, libcomm::Stream& stream, Report* report)
    : options_(options), comm_(comm), stream_(stream), report_(report) {}

libcomm::Result<std::unique_ptr<Runner>> Runner::create(const Options& options, libcomm::Communicator& comm,
                                                        libcomm::Stream& stream, Report* report) {
  std::unique_ptr<Runner> runner(new Runner(options, comm, stream, report));
  const size_t n = static_cast<size_t>(comm.size());
  size_t aBytes = 0, bBytes = 0;
  for (Coll coll : options.colls) {
    for (const Row& row : planRows(options, coll, comm.size())) {
      const size_t in = dataTypeSize(row.types.in), out = dataTypeSize(row.types.out);
      if (coll == Coll::kAllGather) {
        aBytes = std::max(aBytes, row.count * in);
        bBytes = std::max(bBytes, (n * row.count + kGuardElems) * out);
      } else if (coll == Coll::kAllReduce) {
        aBytes = std::max(aBytes, row.count * in);
        bBytes = std::max(bBytes, (row.count + kGuardElems) * out);  // in place: send is recv
      } else {
        aBytes = std::max(aBytes, (n * row.count + kGuardElems) * in);  // in place, the guard follows send
        bBytes = std::max(bBytes, (row.count + kGuardElems) * out);
      }
    }
  }
  if (options.deviceMemory) {
    LIBCOMM_RETURN_IF_ERROR(device::select(comm.rank()).status());
    runner->hostStream_ = libcomm::createHostStream("comm_bench host");
  }
  LIBCOMM_RETURN_IF_ERROR(runner->allocate(runner->a_, aBytes + kSlackBytes, options.registered, options.deviceMemory));
  LIBCOMM_RETURN_IF_ERROR(runner->allocate(runner->b_, bBytes + kSlackBytes, options.registered, options.deviceMemory));
  LIBCOMM_RETURN_IF_ERROR(runner->allocate(runner->results_, n * kSlotFloats * sizeof(float), true, false));
  return runner;
}

Runner::~Runner() {
  // Never free memory a collective may still touch. A failed stream still drains (it skips the
  // rest) and synchronize returns its sticky error once it has; only an expired deadline means
  // work may still run, and then the buffers are leaked.
  const Deadline deadline = Deadline::after(timeout());
  if (!stream_.synchronize(deadline).isOk() && deadline.expired()) return;
  release(a_);
  release(b_);
  release(results_);
}

Status Runner::allocate(Buffer& buffer, size_t bytes, bool registered, bool onDevice) {
  bytes = roundUp(bytes, 4096);
  if (onDevice) {
    LIBCOMM_ASSIGN_OR_RETURN(void* p, device::alloc(bytes));
    buffer.ptr = static_cast<char*>(p);
    buffer.bytes = bytes;
    if (registered) {
      Status s = comm_.registerBuffer(p, bytes);
      if (!s.isOk()) {
        device::release(p);
        buffer.ptr = nullptr;
        return s;
      }
    }
    buffer.registered = registered;
    buffer.host = static_cast<char*>(malloc(bytes));
    if (!buffer.host) return libcomm::makeError(libcomm::StatusCode::kSystemError, "cannot allocate a host mirror");
    memset(buffer.host, 0, bytes);
    return Status::ok();
  }
  if (registered) {
    LIBCOMM_ASSIGN_OR_RETURN(void* p, comm_.allocRegistered(bytes));
    buffer.ptr = static_cast<char*>(p);
  } else {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes) != 0) {
      return libcomm::makeError(libcomm::StatusCode::kSystemError, "rank ", comm_.rank(), ": cannot allocate ", bytes,
                                " bytes of host memory");
    }
    buffer.ptr = static_cast<char*>(p);
  }
  buffer.bytes = bytes;
  buffer.registered = registered;
  // First touch is slow here (PERF-NOTES): pay it once, outside any timing.
  memset(buffer.ptr, 0, bytes);
  return Status::ok();
}

void Runner::release(Buffer& buffer) {
  if (!buffer.ptr) return;
  if (buffer.host) {
    if (buffer.registered) (void)comm_.deregisterBuffer(buffer.ptr);
    device::release(buffer.ptr);
    free(buffer.host);
    buffer.ptr = buffer.host = nullptr;
    return;
  }
  if (buffer.registered) {
    Status s = comm_.freeRegistered(buffer.ptr);
    if (!s.isOk()) fprintf(stderr, "comm_bench rank %d: freeRegistered: %s\n", comm_.rank(), s.toString().c_str());
  } else {
    free(buffer.ptr);
  }
  buffer.ptr = nullptr;
}

libcomm::Milliseconds Runner::timeout() const {
  return options_.timeoutMs ? libcomm::Milliseconds(options_.timeoutMs) : comm_.config().opTimeout;
}

Status Runner::sync(const char* what, int ops) {
  // The communicator fails any one collective that runs past the timeout; this deadline only
  // backs that up, so it grows with the number of collectives queued.
  constexpr long long kMaxMs = 30LL * 24 * 3600 * 1000;
  const long long ms = std::min(kMaxMs / (ops + 1), static_cast<long long>(timeout().count())) * (ops + 1);
  Status s = stream_.synchronize(Deadline::after(libcomm::Milliseconds(ms)));
  if (!s.isOk()) return s.withContext(what);
  return Status::ok();
}

Status Runner::enqueue(const Row& row, const void* send, void* recv) {
  if (row.coll == Coll::kAllGather) return comm_.allGather(send, recv, row.count, row.types.in, stream_);
  libcomm::ReduceOptions ro;
  ro.op = row.op;
  ro.scale = kPremulScale;
  if (row.coll == Coll::kAllReduce) return comm_.allReduce(send, recv, row.count, row.types.in, ro, stream_);
  return comm_.reduceScatter(send, recv, row.count, row.types.in, row.types.out, ro, stream_);
}

Status Runner::runPlacement(const Row& row, bool inPlace, Placement& result) {
  const size_t rankOffset = static_cast<size_t>(comm_.rank()) * row.count * dataTypeSize(row.types.in);
  // all_gather and all_reduce write b_ (in place, their input is in it too); reduce_scatter reads
  // a_ and in place writes its own chunk of it.
  const bool outputInA = row.coll == Coll::kReduceScatter && inPlace;
  Buffer& sendBuf = row.coll == Coll::kReduceScatter || !inPlace ? a_ : b_;
  Buffer& recvBuf = outputInA ? a_ : b_;
  char* send = sendBuf.ptr;
  char* recv = recvBuf.ptr;
  if (inPlace && row.coll == Coll::kAllGather) send += rankOffset;
  if (outputInA) recv += rankOffset;

  // Each queued collective holds a few hundred bytes until it has run: the loops wait for the
  // stream every kQueueWindow collectives, so that -n 100000000 does not queue tens of GB (one
  // drain per window costs the timed loop nothing measurable).
  constexpr int kQueueWindow = 65536;
  auto run = [&](int n, const char* what) -> Status {
    for (int i = 0; i < n; ++i) {
      LIBCOMM_RETURN_IF_ERROR(enqueue(row, send, recv));
      if ((i + 1) % kQueueWindow == 0 && i + 1 < n) LIBCOMM_RETURN_IF_ERROR(sync(what, kQueueWindow));
    }
    return sync(what, n % kQueueWindow == 0 ? kQueueWindow : n % kQueueWindow);
  };
  LIBCOMM_RETURN_IF_ERROR(run(options_.warmup, "warmup"));
  LIBCOMM_RETURN_IF_ERROR(barrierAll("barrier before the timed loop"));

  const auto start = std::chrono::steady_clock::now();
  LIBCOMM_RETURN_IF_ERROR(run(options_.iters, "timed loop"));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  result.timeUs = std::chrono::duration<double, std::micro>(elapsed).count() / options_.iters;

  result.wrong = -1;
  result.digest = 0;
  if (!options_.check) return Status::ok();
  // Checked after the timed loop, so that state left behind by back-to-back runs is checked too.
  CheckCase c;
  c.coll = row.coll;
  c.inType = row.types.in;
  c.outType = row.types.out;
  c.op = row.op;
  c.scale = kPremulScale;
  c.rank = comm_.rank();
  c.nranks = comm_.size();
  c.count = row.count;
  c.seq = ++checkSeq_;
  c.inPlace = inPlace;
  // bf16 partials apply to a host reduce_scatter across hosts (on one host the ranks sum their
  // peers' inputs in fp32, whatever the setting, so the exact bound stays); a host all_reduce's
  // ring keeps fp32 (on device memory NCCL decides, so the wider bound stays).
  c.bf16Partials = comm_.config().reducePartials == libcomm::PartialsType::kBFloat16 &&
                   ((row.coll == Coll::kReduceScatter && comm_.numHosts() > 1) || options_.deviceMemory);
  prepareCheck(c, sendBuf.mirror(send), recvBuf.mirror(recv));
  if (options_.deviceMemory) LIBCOMM_RETURN_IF_ERROR(mirrorsToDevice());
  LIBCOMM_RETURN_IF_ERROR(enqueue(row, send, recv));
  LIBCOMM_RETURN_IF_ERROR(sync("checked run", 1));
  if (options_.deviceMemory) {
    LIBCOMM_RETURN_IF_ERROR(mirrorsToHost());
    // Peers read this rank's input until they are done: nobody rewrites it for the next row before.
    LIBCOMM_RETURN_IF_ERROR(barrierAll("barrier after the checked run"));
  }
  result.wrong = static_cast<int64_t>(verifyCheck(c, sendBuf.mirror(send), recvBuf.mirror(recv)));
  result.digest = outputDigest(c, recvBuf.mirror(recv));
  return Status::ok();
}

Status Runner::exchange(Row& row, const Placement& oop, const Placement& ip) {
  const size_t n = static_cast<size_t>(comm_.size());
  const double mine[kSlotDoubles] = {oop.timeUs,
                                     ip.timeUs,
                                     static_cast<double>(oop.wrong),
                                     static_cast<double>(ip.wrong),
                                     static_cast<double>(oop.digest),
                                     static_cast<double>(ip.digest)};
  static_assert(sizeof(mine) == kSlotFloats * sizeof(float));
  char* slots = results_.ptr;
  memcpy(slots + comm_.rank() * sizeof(mine), mine, sizeof(mine));
  // In place; all_gather moves bytes without looking at them, so doubles travel as pairs of floats.
  LIBCOMM_RETURN_IF_ERROR(
      comm_.allGather(slots + comm_.rank() * sizeof(mine), slots, kSlotFloats, DataType::kFloat32, exchangeStream()));
  LIBCOMM_RETURN_IF_ERROR(exchangeStream().synchronize(Deadline::after(timeout())).withContext("exchange of results"));
  double sumWrongOop = 0, sumWrongIp = 0;
  std::vector<double> times[2];  // out of place, in place: each rank's
  double rank0Digest[2] = {0, 0};
  int64_t disagreeing[2] = {0, 0};  // ranks whose output bits differ from rank 0's
  for (size_t r = 0; r < n; ++r) {
    double theirs[kSlotDoubles];
    memcpy(theirs, slots + r * sizeof(theirs), sizeof(theirs));
    times[0].push_back(theirs[0]);
    times[1].push_back(theirs[1]);
    sumWrongOop += theirs[2];
    sumWrongIp += theirs[3];
    for (int p = 0; p < 2; ++p) {
      if (r == 0) rank0Digest[p] = theirs[4 + p];
      disagreeing[p] += theirs[4 + p] != rank0Digest[p];
    }
  }
  // A rank whose all_reduce output differs from rank 0's counts as one wrong element even when
  // each is within the tolerance: every rank must hold the same result.
  sumWrongOop += sumWrongOop < 0 ? 0 : static_cast<double>(disagreeing[0]);
  sumWrongIp += sumWrongIp < 0 ? 0 : static_cast<double>(disagreeing[1]);
  row.outOfPlace.timeUs = timeOfRanks(times[0], options_.timeOf);
  row.inPlace.timeUs = timeOfRanks(times[1], options_.timeOf);
  // Every rank checks or none does, so -1 summed over ranks stays negative.
  row.outOfPlace.wrong = sumWrongOop < 0 ? -1 : static_cast<int64_t>(sumWrongOop);
  row.inPlace.wrong = sumWrongIp < 0 ? -1 : static_cast<int64_t>(sumWrongIp);
  return Status::ok();
}

Status Runner::runRow(Row& row) {
  Placement oop, ip;
  auto context = [&](const Status& s, bool inPlace) {
    return s.withContext(libcomm::detail::strCat("rank ", comm_.rank(), ": ", rowName(row, inPlace)));
  };
  Status s = runPlacement(row, false, oop);
  if (!s.isOk()) return context(s, false);
  if (row.inPlace.ran) {
    s = runPlacement(row, true, ip);
    if (!s.isOk()) return context(s, true);
  }
  s = exchange(row, oop, ip);
  if (!s.isOk()) return context(s, row.inPlace.ran);
  for (const Measurement* m : {&row.outOfPlace, &row.inPlace})
    if (m->ran && m->wrong > 0) totalWrong_ += m->wrong;
  return Status::ok();
}

Status Runner::run() {
  for (Coll coll : options_.colls) {
    if (report_) report_->beginTable(coll);
    for (Row& row : planRows(options_, coll, comm_.size())) {
      LIBCOMM_RETURN_IF_ERROR(runRow(row));
      if (report_) report_->addRow(row);
    }
    if (report_) report_->endTable();
  }
  return Status::ok();
}

Status Runner::finalBarrier() { return barrierAll("final barrier"); }

Status Runner::barrierAll(const char* what) {
  if (hostStream_) LIBCOMM_RETURN_IF_ERROR(sync(what, 1));  // the device work first, then the ranks meet
  LIBCOMM_RETURN_IF_ERROR(comm_.barrier(exchangeStream()));
  return exchangeStream().synchronize(Deadline::after(timeout())).withContext(what);
}

Status Runner::mirrorsToDevice() {
  LIBCOMM_RETURN_IF_ERROR(device::toDevice(a_.ptr, a_.host, a_.bytes));
  return device::toDevice(b_.ptr, b_.host, b_.bytes);
}

Status Runner::mirrorsToHost() {
  LIBCOMM_RETURN_IF_ERROR(device::toHost(a_.host, a_.ptr, a_.bytes));
  return device::toHost(b_.host, b_.ptr, b_.bytes);
}

}  // namespace comm_bench
