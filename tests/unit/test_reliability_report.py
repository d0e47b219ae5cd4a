"""docs/reliability.md lists the scenarios by number, 11 after 10."""

from tests.reliability.report import _order


def test_scenarios_sort_by_number_then_letter():
    names = ["11. The invariant", "10. Bloat soak", "2. SIGKILL", "6b. Restart", "6a. Restart"]
    rows = sorted(({"scenario": name} for name in names), key=_order)
    assert [row["scenario"] for row in rows] == [
        "2. SIGKILL",
        "6a. Restart",
        "6b. Restart",
        "10. Bloat soak",
        "11. The invariant",
    ]
