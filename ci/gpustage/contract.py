"""What test/steps/test_gpu_prebuilt_race.py and the GPU pipeline share: the variables the
pipeline sets, the figures the tests record, and the skips a GPU run allows (BY_DESIGN)."""

REQUIRE_CUDA_ENV = "SGLANG_BACKPORTS_REQUIRE_CUDA"  # GPU runs: no device fails, not skips
PLAY_CUDA_ENV = "SGLANG_BACKPORTS_PLAY_CUDA"  # a rehearsal: CUDA played, no sgl_kernel
NO_SLEEP_ENV = "SGLANG_BACKPORTS_S1_NO_SLEEP"  # the control: the forward not held back
S1_ITERATIONS_ENV = "SGLANG_BACKPORTS_S1_ITERATIONS"  # at least S1_MIN_ITERATIONS, the default
S1_MIN_ITERATIONS = 200
CSAN_TIMEOUT_S = 300  # below the 10 minutes a lent machine gives one command
S1_PROPERTY, CSAN_PROPERTY = "s1", "csan"  # the recorded figures (pytest's record_property)
# The benchmark's shares: prebuilt batches per decode step (1 is today's upper bound), and
# real decode steps in ms beside the benchmark's own synthetic one (about 1 ms).
ARRIVAL_RATES = (1.0, 0.1, 0.01)
DECODE_STEPS_MS = (5.0, 10.0, 30.0)

NO_CUDA = (
    "no CUDA device (torch.cuda.is_available() is False): the race needs two real CUDA "
    "streams; ci/run-gpu runs these tests on a GPU runner"
)
PLAYED_CUDA = (
    "CUDA is played on a machine without a GPU (a rehearsal): the race needs two real CUDA streams"
)
CUDA_PRESENT = "a real CUDA device is here: the GPU tests above import through the rig"
ONCE_ONLY = "runs once per test run: on the default base's final step"
NO_SLEEP_ONLY = "runs only in the control stage with the forward not held back (sleep 0)"
ONE_QUEUE_ONLY = "runs only in the CUDA_DEVICE_MAX_CONNECTIONS=1 control stage"

BY_DESIGN: dict[str, tuple[str, ...]] = {
    # plays a CUDA machine on CPU; on a GPU the real import is tested instead
    "test_cuda_visible_import_needs_no_sgl_kernel": (CUDA_PRESENT, ONCE_ONLY),
    "test_call_time_imports_need_no_sgl_kernel": (CUDA_PRESENT, ONCE_ONLY),
    # imports torch and sglang in a fresh process: once is enough
    "test_csan_child_imports_as_a_plain_script": (ONCE_ONLY,),
    # the control that hides the race; the other GPU tests refuse its environment
    "test_one_hardware_queue_hides_the_race": (ONE_QUEUE_ONLY,),
    # the control of the timing: without the hold-back the seed wins even without the fix
    "test_without_the_hold_back_the_seed_wins": (NO_SLEEP_ONLY,),
}


def allowed(test: str, reason: str, rehearsal: bool) -> bool:
    """Whether a skip of test (a function name, parameters dropped) is by design."""
    by_design = BY_DESIGN.get(test.partition("[")[0], ())
    return reason in by_design or (rehearsal and reason in (NO_CUDA, PLAYED_CUDA))
