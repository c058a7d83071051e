"use strict";
/* The engine graphs of `qdq compare --format html`: A's and B's layers side by side, one row per row
   of the alignment, so a layer and its counterpart sit at one height. What each box says and links to
   comes from the page's JSON (#engine-graph-data); this script collapses and expands network regions
   and draws the rows that are visible. dagre keeps the rows fixed (ranker "none") and chooses each
   box's column and each edge's route. */
(function () {
  var data = JSON.parse(document.getElementById("engine-graph-data").textContent);
  var holder = document.getElementById("engine-graph");
  var BOX_W = 236, BOX_H = 46, SEP = 14, LABEL_W = 200, GAP = 40, TOP = 26;
  var collapsed = data.blocks.map(function (b) { return b.collapsed; });

  /* The rows drawn: one per pair of an expanded region, one per collapsed region. */
  function visibleRows() {
    var rowOf = [], visible = [];
    data.rows.forEach(function (block, i) {
      var last = visible[visible.length - 1];
      if (!collapsed[block]) visible.push({block: block});
      else if (!last || last.block !== block) visible.push({block: block, collapsed: true});
      rowOf[i] = visible.length - 1;
    });
    return {rowOf: rowOf, visible: visible};
  }

  function blockNode(side, block, row) {
    var b = data.blocks[block], count = b.layers[side.key], diffs = b.diffs;
    return {id: "g" + side.key + "-blk-" + block, domId: "g" + side.key + "-blk-" + block, rank: 2 * row,
      width: BOX_W, height: BOX_H, cls: "block" + (diffs ? " has-diff" : ""), data: {block: block},
      lines: ["\u25b8 " + b.region, count + " layer" + (count === 1 ? "" : "s") + (b.ms[side.key] ? " \u00b7 " + b.ms[side.key] : ""),
        diffs ? diffs + " difference" + (diffs === 1 ? "" : "s") + " (click to expand)" : "click to expand"],
      title: b.region + ": " + count + " layers of " + side.label + "; click to expand"};
  }

  function placeSide(side, rows) {
    var nodes = [], nodeOf = {}, rankOf = {}, used = [];
    side.layers.forEach(function (layer) {
      var i = layer.j - 1, row = rows.rowOf[i], block = data.rows[i], id;
      if (collapsed[block]) {
        id = "g" + side.key + "-blk-" + block;
        if (!used[row]) nodes.push(blockNode(side, block, row));
      } else {
        id = "g" + side.key + "-" + layer.j;
        nodes.push({id: id, domId: id, rank: 2 * row, width: BOX_W, height: BOX_H, cls: layer.cls, lines: layer.lines,
          title: layer.title, href: layer.href, badge: layer.badge});
      }
      used[row] = true;
      nodeOf[layer.j] = id;
      rankOf[id] = row;
    });
    rows.visible.forEach(function (v, row) {  // an empty row still takes its height, so both sides line up
      if (!used[row]) nodes.push({id: side.key + "-gap-" + row, rank: 2 * row, width: 8, height: BOX_H, hidden: true});
    });
    var seen = {}, edges = [];
    side.edges.forEach(function (e) {
      var from = nodeOf[e[0]], to = nodeOf[e[1]], key = from + ">" + to;
      // Inside a collapsed region, repeated, or against the row order (a pair TensorRT ran in swapped order).
      if (from === undefined || to === undefined || rankOf[from] >= rankOf[to] || seen[key]) return;
      seen[key] = true;
      edges.push({from: from, to: to, title: e[2], cls: e[3]});
    });
    // A large drawing keeps dagre's first column order (it follows the tensors depth first) and skips
    // the crossing-reduction sweeps, two thirds of the layout time; engines are nearly chains.
    var size = QdqGraph.layout(nodes, edges, {ranker: "none", nodesep: 18, ranksep: SEP, marginx: 0, marginy: 0},
      {disableOptimalOrderHeuristic: data.large});
    return {nodes: nodes, edges: edges, width: Math.max(size.width, BOX_W)};
  }

  function rowTop(row) { return TOP + row * (BOX_H + SEP) - SEP / 2; }

  /* Bands behind the rows of each region, with its name and a toggle in the left column. */
  function bands(rows, width) {
    var out = "", start = 0;
    rows.visible.forEach(function (v, row) {
      var next = rows.visible[row + 1];
      if (next && next.block === v.block) return;
      var b = data.blocks[v.block], y = rowTop(start), h = rowTop(row + 1) - y;
      out += "<g class='band" + (v.block % 2 ? " odd" : "") + (b.diffs ? " has-diff" : "") + "'>" +
        "<rect x='0' y='" + y + "' width='" + width + "' height='" + h + "'/>" +
        "<text class='region' data-block='" + v.block + "' x='4' y='" + (y + 16) + "'>" +
        (collapsed[v.block] ? "\u25b8 " : "\u25be ") +
        QdqGraph.esc(b.region.length > 26 ? b.region.slice(0, 25) + "\u2026" : b.region) + "<title>" +
        QdqGraph.esc(b.region) + (collapsed[v.block] ? ": click to expand" : ": click to collapse") + "</title></text>" +
        (b.diffs ? "<text class='count' x='4' y='" + (y + 30) + "'>" + b.diffs + " difference" + (b.diffs === 1 ? "" : "s") +
          "</text>" : "") + "</g>";
      start = row + 1;
    });
    return out;
  }

  function render() {
    var started = performance.now();
    var rows = visibleRows();
    var a = placeSide(data.sides[0], rows), b = placeSide(data.sides[1], rows);
    var xb = LABEL_W + a.width + GAP, width = xb + b.width + 8, height = rowTop(rows.visible.length) + SEP;
    var head = data.sides.map(function (side, k) {
      var room = Math.floor(((k ? b.width : a.width + GAP) - 8) / 8), label = side.label;
      if (label.length > room) label = label.slice(0, room - 1) + "\u2026";
      return "<text class='side' x='" + (k ? xb : LABEL_W) + "' y='14'>" + QdqGraph.esc(label) + "<title>" +
        QdqGraph.esc(side.label) + "</title></text>";
    }).join("");
    var body = bands(rows, width) + head + QdqGraph.markup(a.nodes, a.edges, LABEL_W, TOP) +
      QdqGraph.markup(b.nodes, b.edges, xb, TOP);
    holder.innerHTML = QdqGraph.svg(width, height, body, "engine graphs of A and B side by side");
    holder.setAttribute("data-rows", rows.visible.length);
    holder.setAttribute("data-render-ms", (performance.now() - started).toFixed(0));
  }

  function toggle(block, open) {
    collapsed[block] = open === undefined ? !collapsed[block] : !open;
  }

  /* A link to a box inside a collapsed region (from the differences table) opens the region first. */
  function reveal() {
    var match = /^#g[ab]-(\d+)$/.exec(location.hash);
    var block = match ? data.rows[Number(match[1]) - 1] : undefined;
    if (block === undefined || !collapsed[block]) return;
    toggle(block, true);
    render();
    document.getElementById(location.hash.slice(1)).scrollIntoView({block: "center"});
  }

  holder.addEventListener("click", function (event) {
    var target = event.target.closest("[data-block]");
    if (!target || event.target.closest("a")) return;
    toggle(Number(target.getAttribute("data-block")));
    render();
  });
  document.getElementById("expand-all").addEventListener("click", function () {
    data.blocks.forEach(function (b, k) { toggle(k, true); });
    render();
  });
  document.getElementById("collapse-quiet").addEventListener("click", function () {
    data.blocks.forEach(function (b, k) { toggle(k, b.diffs > 0); });
    render();
  });
  /* #graphs-alone shows the drawing alone, in the whole window (to present it, or to take a picture). */
  function alone() {
    document.body.classList.toggle("graphs-alone", location.hash === "#graphs-alone");
  }

  window.addEventListener("hashchange", function () { alone(); reveal(); });
  render();
  alone();
  reveal();
})();
