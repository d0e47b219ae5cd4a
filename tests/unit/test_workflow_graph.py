"""The workflow graph's layout and SVG, without a database."""

from __future__ import annotations

import re

from django_pgqueue.workflows.graph import NODE_H, NODE_W, PER_ROW, Node, graph_svg, layers, layout


def node(job_id: int, *parents: int, status: str = "pending", name: str = "") -> Node:
    return Node(job_id, name or f"step-{job_id}", status, parents, f"/job/{job_id}/")


def test_layers_are_the_longest_path_depth():
    # 1 -> 2 -> 3, and 1 -> 3 directly: 3 is two layers down, not one.
    nodes = [node(1), node(2, 1), node(3, 1, 2), node(4)]
    assert [[n.id for n in layer] for layer in layers(nodes)] == [[1, 4], [2], [3]]


def test_a_layer_follows_its_parents_order():
    # Roots 1 and 2; 3 waits for 2 and 4 for 1: 4 is drawn left of 3.
    nodes = [node(1), node(2), node(3, 2), node(4, 1)]
    assert [n.id for n in layers(nodes)[1]] == [4, 3]


def test_a_wide_layer_wraps_into_rows_on_one_grid_and_nothing_overlaps():
    members = [node(n) for n in range(1, 2 * PER_ROW + 2)]
    callback = node(100, *(m.id for m in members))
    placed, width, height = layout([*members, callback])
    rows: dict[float, list[float]] = {}
    for p in placed:
        rows.setdefault(p.y, []).append(p.x)
    assert [len(xs) for _, xs in sorted(rows.items())] == [PER_ROW, PER_ROW, 1, 1]
    columns = set(sorted(rows.items())[0][1])
    assert set(sorted(rows.items())[2][1]) <= columns  # the short row stays on the grid
    boxes = [(p.x, p.y) for p in placed]
    assert len(set(boxes)) == len(boxes)
    assert all(0 <= x <= width - NODE_W and 0 <= y <= height - NODE_H for x, y in boxes)
    # Every member's edge bends below its layer's last row.
    ys = sorted(rows)
    assert {p.bottom for p in placed if p.node.id != 100} == {ys[2] + NODE_H}


def test_the_svg_has_a_linked_node_per_step_an_edge_per_dependency_and_escapes_labels():
    svg = graph_svg(
        "a <b>",
        [
            node(1, status="completed", name="<script>"),
            node(2, 1, status="running"),
            node(3, 1, 2, status="waiting"),
        ],
    )
    assert re.findall(r'<a href="(/job/\d+/)" class="pgqueue-node pgqueue-node-(\w+)"', svg) == [
        ("/job/1/", "completed"),
        ("/job/2/", "running"),
        ("/job/3/", "waiting"),
    ]
    assert svg.count('class="pgqueue-edge"') == 3
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert 'aria-label="a &lt;b&gt;"' in svg


def test_nothing_to_draw_is_an_empty_drawing():
    placed, width, height = layout([])
    assert placed == []
    assert width > 0
    assert height > 0
