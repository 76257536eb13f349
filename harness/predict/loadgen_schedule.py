"""LoadGen's Server schedule, reproduced: the times at which a run at `target_qps` issues its
queries, to the nanosecond, so that a simulated run meets the load a real one meets.

LoadGen (loadgen.cc, GenerateQueries) draws each gap from `std::exponential_distribution(qps)` over
`std::mt19937(schedule_rng_seed)` and truncates it to whole nanoseconds; the first query goes at 0,
and queries are generated until one is scheduled at or past min_duration and min_query_count are
issued. The wheel is built with libstdc++, whose exponential draw is -log(1 - u) / qps with u from
generate_canonical<double, 53>: two 32-bit outputs, low word first, over 2^64. The mt19937 is
numpy's (the same generator, seeded as C++ seeds it: init_genrand with the seed's low 32 bits)."""

import math

import numpy as np

TWO_32 = 2.0**32
BELOW_ONE = math.nextafter(1.0, 0.0)


def mt19937(seed: int) -> np.random.MT19937:
    """std::mt19937(seed): libstdc++ keeps the seed modulo 2^32."""
    generator = np.random.MT19937()
    key, pos = np.random.RandomState(seed % 2**32).get_state()[1:3]  # init_genrand, as C++ seeds
    generator.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}
    return generator


def canonical(generator: np.random.MT19937) -> float:
    """std::generate_canonical<double, 53>(mt19937) as libstdc++ computes it."""
    low, high = (float(x) for x in generator.random_raw(2))
    u = (low + high * TWO_32) / (TWO_32 * TWO_32)
    return u if u < 1.0 else BELOW_ONE


def server_schedule(target_qps: float, seed: int, min_duration_ms: int, min_query_count: int) -> tuple[list[int], int]:
    """The nanoseconds after the run's start at which LoadGen's Server run issues each query, and
    its `generated_query_duration` (where the next query would have gone)."""
    generator, times, t = mt19937(seed), [], 0
    while not times or times[-1] < min_duration_ms * 1_000_000 or len(times) < min_query_count:
        times.append(t)
        t += int(-math.log(1.0 - canonical(generator)) / target_qps * 1e9)  # duration_cast truncates
    return times, t
