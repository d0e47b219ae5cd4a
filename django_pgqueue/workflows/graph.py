"""A workflow's graph as server-side SVG: plain Python, no JavaScript, no build step.

Steps are laid out top to bottom in layers by dependency depth (a step one layer
below the deepest step it waits for); a layer wider than `PER_ROW` wraps into rows.
Within a layer the steps are ordered by where their parents stand, which keeps most
edges short. Each node is a link, coloured by its job's status through the class
``pgqueue-node-<status>`` (the stylesheet gives it the status badge's colour). Every
label is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

PER_ROW = 6
NODE_W, NODE_H = 168, 40
GAP_X, ROW_GAP, LAYER_GAP = 22, 18, 44
MARGIN = 12
NAME_CHARS = 22


@dataclass(frozen=True)
class Node:
    id: int
    name: str
    status: str
    parents: Sequence[int]
    href: str
    tooltip: str = ""


@dataclass(frozen=True)
class Placed:
    node: Node
    x: float
    y: float
    bottom: float  # the bottom of its layer (of the layer's last row)


def layers(nodes: Sequence[Node]) -> list[list[Node]]:
    """The nodes by depth, parents before children; each layer ordered by its parents' places.

    `nodes` come parents first (a workflow's job ids are); a parent not among them is
    left out of the drawing's edges.
    """
    depth: dict[int, int] = {}
    for node in nodes:
        depth[node.id] = 1 + max((depth[p] for p in node.parents if p in depth), default=-1)
    grouped: list[list[Node]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for node in nodes:
        grouped[depth[node.id]].append(node)
    # Where each placed node stands across its layer, from 0 (left) to 1 (right).
    across: dict[int, float] = {}
    for layer in grouped:

        def barycentre(index: int, layer: list[Node] = layer) -> tuple[float, int]:
            known = [across[p] for p in layer[index].parents if p in across]
            own = (index + 0.5) / len(layer)
            return (sum(known) / len(known) if known else own, index)

        layer[:] = [layer[i] for i in sorted(range(len(layer)), key=barycentre)]
        for index, node in enumerate(layer):
            across[node.id] = (index + 0.5) / len(layer)
    return grouped


def layout(nodes: Sequence[Node]) -> tuple[list[Placed], float, float]:
    """Place every node: (placed nodes, width, height) of the drawing.

    A wrapped layer's rows share one grid of columns (a short last row centred on
    whole columns), so an edge leaving an upper row runs straight down behind the
    nodes below it to the bottom of its layer, and bends only from there.
    """
    grouped = layers(nodes)
    widest = min(max((len(layer) for layer in grouped), default=1), PER_ROW)
    width = 2 * MARGIN + widest * NODE_W + (widest - 1) * GAP_X
    placed: list[Placed] = []
    top = MARGIN
    for layer in grouped:
        columns = min(len(layer), PER_ROW)
        left = (width - columns * NODE_W - (columns - 1) * GAP_X) / 2
        rows = [layer[start : start + PER_ROW] for start in range(0, len(layer), PER_ROW)]
        bottom = top + len(rows) * (NODE_H + ROW_GAP) - ROW_GAP
        for number, row in enumerate(rows):
            offset = (columns - len(row)) // 2
            for column, node in enumerate(row, start=offset):
                x = left + column * (NODE_W + GAP_X)
                placed.append(Placed(node, x, top + number * (NODE_H + ROW_GAP), bottom))
        top = bottom + LAYER_GAP
    return placed, width, max(top - LAYER_GAP, MARGIN) + MARGIN


def graph_svg(title: str, nodes: Sequence[Node]) -> SafeString:
    """The SVG drawing of `nodes` and the edges between them."""
    placed, width, height = layout(nodes)
    where = {p.node.id: p for p in placed}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pgqueue-graph" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="{escape(title)}">',
        '<defs><marker id="pgqueue-arrow" viewBox="0 0 8 8" refX="7" refY="4" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L8,4 L0,8 z" class="pgqueue-edge-head"/></marker></defs>',
    ]
    for child in placed:
        for parent_id in child.node.parents:
            parent = where.get(parent_id)
            if parent is None:
                continue
            x1, y0, y1 = parent.x + NODE_W / 2, parent.y + NODE_H, parent.bottom
            x2, y2 = child.x + NODE_W / 2, child.y
            bend = max((y2 - y1) / 2, 12)
            parts.append(
                f'<path class="pgqueue-edge" d="M{x1:.1f},{y0:.1f} L{x1:.1f},{y1:.1f} '
                f'C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}" '
                'marker-end="url(#pgqueue-arrow)"/>'
            )
    for p in placed:
        node = p.node
        name = Truncator(node.name).chars(NAME_CHARS)
        parts.append(
            f'<a href="{escape(node.href)}" class="pgqueue-node pgqueue-node-{escape(node.status)}"'
            f' data-job="{node.id}"><title>{escape(node.tooltip or node.name)}</title>'
            f'<rect x="{p.x:.1f}" y="{p.y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="6"/>'
            f'<text x="{p.x + NODE_W / 2:.1f}" y="{p.y + 17:.1f}" class="pgqueue-node-name">'
            f"{escape(name)}</text>"
            f'<text x="{p.x + NODE_W / 2:.1f}" y="{p.y + 32:.1f}" class="pgqueue-node-status">'
            f"{escape(node.status)} · #{node.id}</text></a>"
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every label above is escaped
