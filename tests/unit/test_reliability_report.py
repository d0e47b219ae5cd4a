"""docs/reliability.md lists the scenarios by number, 11 after 10."""

from tests.reliability.report import ROOT, _order, merge, render


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


def test_merge_keeps_the_other_scenarios_and_writes_the_new_one_in_its_place():
    page = render(
        [
            {"scenario": "2. SIGKILL", "passed": True, "size": 20, "lost": 0, "kills": 3},
            {"scenario": "10. Bloat soak", "passed": True, "size": 9, "notes": "soak"},
        ]
    )
    assert merge(page, []) == page
    row = {"scenario": "6a. Restart", "passed": False, "size": 5, "lost": 1, "restarts": 2}
    merged = merge(page, [row])
    table = [line for line in merged.splitlines() if line.startswith("| ") and ". " in line]
    assert [line.split(" | ")[0] for line in table] == [
        "| 2. SIGKILL",
        "| 6a. Restart",
        "| 10. Bloat soak",
    ]
    assert "| 6a. Restart | **NO** | 5 |" in merged
    sections = [line for line in merged.splitlines() if line.startswith("### ")]
    assert sections == ["### 2. SIGKILL", "### 6a. Restart", "### 10. Bloat soak"]
    for kept in ("- kills: 3", "- restarts: 2", "soak"):
        assert kept in merged
    assert "- measured at: commit " in merged
    # Written again, the row is replaced, not added twice.
    again = merge(merged, [{**row, "passed": True}])
    assert again.count("### 6a. Restart") == 1
    assert "| 6a. Restart | yes | 5 |" in again


def test_merge_keeps_the_page_in_the_repository_as_it_is():
    page = (ROOT / "docs" / "reliability.md").read_text("utf-8")
    assert merge(page, []) == page
