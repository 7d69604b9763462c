"""The playground's training programs (``local_mode.training_programs``) against the moto world."""

from __future__ import annotations

from pathlib import Path

from local_mode.training_programs import PROGRAM_TICK_SECONDS, TrainingPrograms
from local_mode.world import build_world

GROUP, PREFIX, CONTAINER = "/ecs/llama", "train", "trainer"


def test_a_rank_s_log_stream_exists_as_soon_as_its_task_is_running(tmp_path: Path) -> None:
    """The awslogs driver makes the stream before the container runs: ``gpujobs logs`` of a job
    the stack just saw RUNNING must not answer "not found (yet)" until the program's next step."""
    with build_world(handlers=False) as world:
        sim, logs = world.ecs, world.aws.client("logs")
        logs.create_log_group(logGroupName=GROUP)
        programs = TrainingPrograms(sim, {"llama": (GROUP, PREFIX, CONTAINER)}, run_seconds=600,
                                    state_dir=str(tmp_path), note=lambda *_: None)
        programs.start()
        sim.add_node("node-a")
        definition = sim.register_training_task_definition("llama", gpus=8)
        sim.run_for(PROGRAM_TICK_SECONDS / 2)  # the task starts between two of the programs' steps
        (arn,) = sim.start_job("llama", definition, ["node-a"])

        assert sim.run_until_true(lambda: sim.tasks[arn].last_status == "RUNNING", max_seconds=60)
        stream = f"{PREFIX}/{CONTAINER}/{arn.rsplit('/', 1)[-1]}"
        found = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix=stream)["logStreams"]
        assert [s["logStreamName"] for s in found] == [stream]
        assert programs.errors == []
        # The program's first step writes its first line there.
        sim.run_for(PROGRAM_TICK_SECONDS)
        first = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)["events"]
        assert first and "rank 0/1 on node-a" in first[0]["message"]
