"""The sampling check's pure judgement: settings read back, one seed repeats, two seeds differ."""

from orchestrator.checks.sampling import SETTINGS, sampling_problems, settings_problems


def test_settings_read_back_must_match_what_was_sent():
    sent = {**SETTINGS, "seed": 7}
    assert settings_problems(sent, dict(sent), "A") == []
    clamped = {**sent, "temperature": 0.0}
    (p,) = settings_problems(sent, clamped, "A")
    assert "generation_settings.temperature is 0.0" in p
    assert len(settings_problems(sent, {}, "A")) == len(sent)


def test_one_seed_repeats_and_two_seeds_differ():
    assert sampling_problems([1, 2, 3], [1, 2, 3], [1, 5, 3]) == []
    assert any("same seed gave different" in p for p in sampling_problems([1, 2], [2, 1], [3, 3]))
    (p,) = sampling_problems([1, 2, 3], [1, 2, 3], [1, 2, 3])  # a greedy sampler whatever it is told
    assert "gave the same 3 tokens" in p
    assert "no tokens" in sampling_problems([], [], [1])[0]
