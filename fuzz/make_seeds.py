"""Writes the seed inputs of the fuzz targets into fuzz/corpus/<target>/.

A seed is one rank's call whose peers send matching argument-check headers
(the first thing every collective exchanges) followed by small, plausible
counts and entries, so that the fuzzer starts past the header check and
mutates the messages that follow. Layout: see each target's reads in
fuzz/fuzz_*.cc and fuzz/fuzz_input.h; run `python fuzz/make_seeds.py`.
"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def header(size, nnz, algorithm, param=0):
    return struct.pack("<7q", size, nnz, algorithm, 0, 0, 0, param)


def bruck_headers(one, nranks):
    """What the peers send in the argument check (Bruck's allgather, point to point):
    round d = 1, 2, 4, ... one message of min(d, P - d) headers, each message read by
    fake_mpi after its control byte (0: delivered in full)."""
    out, d = b"", 1
    while d < nranks:
        out += bytes([0]) + one * min(d, nranks - d)
        d *= 2
    return out


def in_range(value, lo, hi):
    """The bytes fuzz::Input::in_range reads to give `value`."""
    span = hi - lo + 1
    return bytes([value - lo]) if span <= 256 else struct.pack("<H", value - lo)


def plausible_messages(size, count=12):
    """Counts, then sorted entries, repeated: what peers of a small call send."""
    out = b""
    for i in range(count):
        out += struct.pack("<q", 2)
        out += bytes([0]) + struct.pack("<ifif", i % size, 1.0, (i + 1) % size, -2.0)
    return out


def coo(size, entries):
    out = in_range(len(entries), 0, 64)
    for index, value in entries:
        out += bytes([0]) + in_range(index, -1, size - 1) + bytes([value + 8])
    return out


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    size = 24
    entries = [(1, 1), (5, 2), (5, -1), (17, 3), (-1, 0)]
    algorithms = {"dense": 0, "allgather": 1, "recursive_doubling": 2, "split_allgather": 3,
                  "dsar": 4, "hash_partition": 7}
    for name, algo in algorithms.items():
        for nranks, rank in ((2, 0), (2, 1), (3, 1), (5, 4)):
            variant = 1 if name == "dsar" and nranks == 3 else 0  # QSGD, 2 bits
            data = in_range(nranks, 1, 8) + in_range(rank, 0, nranks - 1)
            data += in_range(size, 1, 300) + in_range(list(algorithms.values()).index(algo), 0, 5)
            data += bytes([0, variant]) + (in_range(8, 1, 64) if variant else b"")
            data += struct.pack("<I", 7) + coo(size, entries)
            data += bruck_headers(header(size, 3, algo | ((2 << 16) if variant else 0)), nranks)
            data += plausible_messages(size)
            write("fuzz_sparse_allreduce", f"{name}_p{nranks}_r{rank}", data)

    for nranks, rank in ((2, 0), (3, 2), (6, 1)):
        for flags in (0, 3):
            data = in_range(nranks, 1, 8) + in_range(rank, 0, nranks - 1)
            data += in_range(size, 1, 300) + in_range(4, 0, size) + bytes([0, flags])
            data += bytes([9])  # threshold_in 1.0
            data += coo(size, entries)
            data += bruck_headers(header(size, 3, 5, 4), nranks) + plausible_messages(size, 40)
            write("fuzz_oktopk", f"flags{flags}_p{nranks}_r{rank}", data)

    for nranks, rank in ((2, 1), (4, 0)):
        for which, param, algo in ((1, 4, 6), (0, 0, 0), (2, 1, 0), (0, 2, 0)):
            data = in_range(nranks, 1, 8) + in_range(rank, 0, nranks - 1) + bytes([which])
            data += in_range(size, 1, 300) + bytes([0]) + in_range(param, 0, 40)
            data += bytes([0, 9, 1, 1, 1, 0, 12, 1, 1, 1] * 3)[:size * 2]
            data += bruck_headers(header(size, 2, algo, param), nranks)
            data += struct.pack("<q", 5) + bytes([0, 0x0f]) + struct.pack("<4f", 1, 2, 3, 4) * 8
            write("fuzz_block_dense", f"which{which}_param{param}_p{nranks}_r{rank}", data)

    # Errors in the middle of an exchange while sends are posted: the library must
    # cancel the receives and no send (fake_mpi's MPI_Cancel of a send aborts), taking
    # each request's kind from its records (jss::cancel_pending).
    # split-allgather, P = 3, rank 1, entries in rank 0's and rank 2's ranges: the
    # counts arrive, then the slice from rank 0 is too long for its receive (0xfd:
    # fails at the wait) while both slices to the peers are posted.
    counts = in_range(3, 1, 8) + in_range(1, 0, 2) + in_range(size, 1, 300) + in_range(3, 0, 5)
    counts += bytes([0, 0]) + struct.pack("<I", 7) + coo(size, [(1, 1), (5, 2), (17, 3)])
    counts += bruck_headers(header(size, 3, 3), 3)
    counts += (bytes([0]) + struct.pack("<q", 8)) * 2  # the counts from ranks 0 and 2
    data = counts + bytes([0xfd]) + bytes([0]) + bytes(8)  # the slices from ranks 0 and 2
    write("fuzz_sparse_allreduce", "regression-split-allgather-wait-fails-with-sends-posted",
          data)
    # The same call, both slices too long for their receives: the one from rank 0 fails
    # the wait (0xfd: completed in error); the one from rank 2 (0xfc) then fails the
    # MPI_Test of cancel_pending too, which leaves it allocated (fake_mpi's 0xfc): the
    # Test-error branch must free it (MPI_Request_free), or the call returns with it
    # pending.
    data = counts + bytes([0xfd, 0xfc])
    write("fuzz_sparse_allreduce", "regression-split-allgather-cancelled-receive-test-fails",
          data)
    # Ok-Topk, P = 6, rank 1, fixed boundaries (regions of 4), its one entry outside its
    # own region for rank 0 (j = 5: the second bucket). Every peer sends one entry:
    # bucket 1 (j = 1..4) receives from ranks 0, 5, 4, 3 and sends nothing, bucket 2
    # receives from rank 2 and sends to rank 0. Bucket 1's receive from rank 0 fails at
    # its wait while bucket 2 is posted: the guard cancels bucket 2's receive, not its
    # send (its kinds: next_peers).
    data = in_range(6, 1, 8) + in_range(1, 0, 5) + in_range(size, 1, 300) + in_range(4, 0, size)
    data += bytes([0, 0]) + bytes([9]) + coo(size, [(1, 1), (5, 2)])
    data += bruck_headers(header(size, 3, 5, 4), 6)
    data += (bytes([0]) + struct.pack("<q", 1)) * 5  # the counts, posted for j = 1 .. 5
    data += bytes([0xfd])  # bucket 1, from rank 0: too long, fails at the wait
    for index in (4, 4, 4, 5):  # from ranks 5, 4, 3, then bucket 2's from rank 2
        data += bytes([0]) + struct.pack("<if", index, 1.0)
    write("fuzz_oktopk", "regression-oktopk-second-bucket-sends-when-first-fails", data)

    for i, (a, b) in enumerate([(entries, entries[:2]), (entries, [])]):
        data = in_range(size, 1, 200) + in_range(size // 2, 0, size)
        for side in (a, b):
            data += bytes([1]) + in_range(len(side), 0, 2 * size)
            for index, value in side:
                data += in_range(index, -1, size - 1) + bytes([value + 8])
        data += in_range(3, 1, 8) + bytes([5, 10])
        write("fuzz_sparse_stream", f"seed{i}", data)


if __name__ == "__main__":
    main()
