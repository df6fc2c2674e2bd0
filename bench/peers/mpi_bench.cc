// mpi_bench: MPI_Allgather, MPI_Reduce_scatter_block and MPI_Allreduce (fp32 sum) measured the way nccl-tests
// measures, so the numbers sit beside comm_bench's: the time is the slowest rank's, as comm_bench shows by default
// (-a 3; nccl-tests' default is the mean over ranks). Run under mpirun; rank 0 prints the table and writes the
// JSON lines.
//
//   mpirun -np 2 mpi_bench all_gather -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 -J out.jsonl
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "peer_common.h"

namespace {

using peers::Options;
using peers::Result;

/// What the ranks ran with: the Open MPI parameters that shape the data path (they reach the ranks as
/// OMPI_MCA_* variables from mpirun's --mca) and glibc's malloc knobs. compare.sh may pass its own text in
/// PEER_SETTINGS, which then comes first.
std::string describeSettings() {
  std::string out;
  if (const char* s = std::getenv("PEER_SETTINGS")) out = s;
  static const char* kPrefixes[] = {"OMPI_MCA_pml",       "OMPI_MCA_btl", "OMPI_MCA_coll",
                                    "OMPI_MCA_mpi_yield", "UCX_TLS",      "MALLOC_"};
  for (char** e = environ; *e != nullptr; ++e) {
    for (const char* p : kPrefixes) {
      if (std::strncmp(*e, p, std::strlen(p)) == 0) {
        if (!out.empty()) out += ' ';
        out += *e;
        break;
      }
    }
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string v(version, static_cast<size_t>(len));
  v = v.substr(0, v.find_first_of(",\n"));
  if (!out.empty()) v += " | " + out;
  return v;
}

class Bench {
 public:
  Bench(const Options& o, int rank, int nranks, size_t maxBytes) : o_(o), rank_(rank), nranks_(nranks) {
    // Allocated and touched once at the largest size; every size reuses them.
    send_ = static_cast<float*>(peers::allocTouched(maxBytes + peers::kGuardBytes));
    recv_ = static_cast<float*>(peers::allocTouched(maxBytes + peers::kGuardBytes));
  }

  /// Times o_.iters calls after o_.warmup untimed ones; returns the per-iteration time in us, the max across
  /// ranks (valid on rank 0), and the number of wrong elements summed over ranks when checking.
  Result measure(size_t count, bool inplace) {
    for (int i = 0; i < o_.warmup; ++i) run(count, inplace);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < o_.iters; ++i) run(count, inplace);
    double local = (MPI_Wtime() - t0) / o_.iters * 1e6;
    double slowest = 0;
    MPI_Reduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    long wrong = -1;
    if (o_.check) {
      long mine = 0;
      if (allGather()) {
        peers::fillAllGather(send_, recv_, count, rank_, nranks_, inplace);
        run(count, inplace);
        mine = peers::checkAllGather(send_, recv_, count, rank_, nranks_, inplace);
      } else if (allReduce()) {
        peers::fillAllReduce(send_, recv_, count, rank_, inplace);
        run(count, inplace);
        mine = peers::checkAllReduce(send_, recv_, count, rank_, nranks_, inplace);
      } else {
        peers::fillReduceScatter(send_, recv_, count, rank_, nranks_, inplace);
        run(count, inplace);
        mine = peers::checkReduceScatter(send_, recv_, count, rank_, nranks_, inplace);
      }
      MPI_Reduce(&mine, &wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    }
    return peers::makeResult(o_.coll, peers::sizeOf(o_.coll, count, nranks_), slowest, nranks_, wrong);
  }

  bool allGather() const { return o_.coll == "all_gather"; }
  bool allReduce() const { return o_.coll == "all_reduce"; }

 private:
  void run(size_t count, bool inplace) {
    const int c = static_cast<int>(count);
    int rc;
    if (allGather()) {
      rc = inplace ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv_, c, MPI_FLOAT, MPI_COMM_WORLD)
                   : MPI_Allgather(send_, c, MPI_FLOAT, recv_, c, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (allReduce()) {
      rc = MPI_Allreduce(inplace ? MPI_IN_PLACE : send_, recv_, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
      rc = MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : send_, recv_, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "mpi_bench: rank %d: %s count %zu failed with MPI error %d\n", rank_, o_.coll.c_str(), count,
                   rc);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  const Options& o_;
  int rank_;
  int nranks_;
  float* send_ = nullptr;
  float* recv_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  Options o = peers::parseArgs(argc, argv, {"all_gather", "reduce_scatter", "all_reduce"});
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (o.nranks != 0 && o.nranks != nranks && rank == 0)
    std::fprintf(stderr, "mpi_bench: -np %d ignored; mpirun started %d ranks\n", o.nranks, nranks);

  const std::vector<size_t> sizes = peers::sweep(o);
  // Counts are per rank (MPI takes int): size is rounded down to nranks * sizeof(float), as nccl-tests does
  // (all_reduce: to sizeof(float), its count being the buffer's).
  if (sizes.back() / sizeof(float) > static_cast<size_t>(INT32_MAX)) {
    if (rank == 0) std::fprintf(stderr, "mpi_bench: -e too large for MPI int counts\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  Bench bench(o, rank, nranks, sizes.back());
  const std::string settings = describeSettings();
  FILE* json = rank == 0 ? peers::openJson(o) : nullptr;
  if (rank == 0) peers::printHeader("openmpi", o, nranks, settings);
  const char* redop = bench.allGather() ? "none" : "sum";
  long wrong = 0;  // rank 0: summed over sizes and placements

  for (size_t requested : sizes) {
    const size_t count = requested / sizeof(float) / (bench.allReduce() ? 1 : nranks);
    const size_t size = peers::sizeOf(o.coll, count, nranks);
    Result oop = bench.measure(count, false);
    Result ip = bench.measure(count, true);
    if (rank == 0) {
      peers::printRow(size, count, "float", redop, oop, ip);
      peers::writeJson(json, "openmpi", o, "float", redop, nranks, size, count, oop, false, settings);
      peers::writeJson(json, "openmpi", o, "float", redop, nranks, size, count, ip, true, settings);
      wrong += std::max(oop.wrong, 0L) + std::max(ip.wrong, 0L);
    }
  }
  if (rank == 0) peers::printFooter();
  if (json != nullptr) std::fclose(json);
  MPI_Finalize();
  // As comm_bench: a check that found wrong elements fails the run (mpirun passes rank 0's status on).
  if (wrong > 0) {
    std::fprintf(stderr, "mpi_bench: %ld wrong elements (see #wrong); exit 1\n", wrong);
    return 1;
  }
  return 0;
}
