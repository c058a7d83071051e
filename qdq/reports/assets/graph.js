"use strict";
/* qdq's graph drawing, shared by the HTML reports: dagre (inlined before this file) places the boxes
   and routes the edges; this file turns the placed graph into SVG markup. Markup is built as text and
   set once, which is much faster than creating thousands of DOM nodes one by one. */
var QdqGraph = (function () {
  var ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;"};

  function esc(text) {
    return String(text).replace(/[&<>"']/g, function (c) { return ENTITIES[c]; });
  }

  /* Place `nodes` ({id, width, height, rank?}) and route `edges` ({from, to}); sets x, y on each node
     (its centre) and points on each edge, and returns the drawing's {width, height}. With `rank` on
     every node and options.ranker "none", the caller fixes the rows (dagre's ranks are 2 apart).
     `layoutOptions` go to dagre.layout itself (e.g. disableOptimalOrderHeuristic). */
  function layout(nodes, edges, options, layoutOptions) {
    var g = new dagre.graphlib.Graph({multigraph: true});
    g.setGraph(Object.assign({nodesep: 24, ranksep: 28, marginx: 4, marginy: 4}, options || {}));
    g.setDefaultEdgeLabel(function () { return {}; });
    nodes.forEach(function (n) {
      var label = {width: n.width, height: n.height};
      if (n.rank !== undefined) label.rank = n.rank;
      g.setNode(n.id, label);
    });
    edges.forEach(function (e, i) { g.setEdge(e.from, e.to, {}, "e" + i); });
    dagre.layout(g, layoutOptions || {});
    nodes.forEach(function (n) { var p = g.node(n.id); n.x = p.x; n.y = p.y; });
    edges.forEach(function (e, i) { e.points = g.edge(e.from, e.to, "e" + i).points; });
    // dagre fits the drawing to the boxes; an edge may bend outside them, so shift by what sticks out left.
    var left = 0, right = g.graph().width;
    edges.forEach(function (e) {
      e.points.forEach(function (p) { left = Math.min(left, p.x - 4); right = Math.max(right, p.x + 4); });
    });
    if (left < 0) {
      nodes.forEach(function (n) { n.x -= left; });
      edges.forEach(function (e) { e.points.forEach(function (p) { p.x -= left; }); });
    }
    return {width: right - left, height: g.graph().height};
  }

  /* One box: a rect with up to three text lines, a tooltip, data-* attributes, an optional link over the whole box and an
     optional badge (its own link, e.g. to a rule) in the bottom right corner. */
  function box(n, dx, dy) {
    var x = n.x - n.width / 2 + dx, y = n.y - n.height / 2 + dy;
    var out = "<g class='node " + esc(n.cls || "") + "'" + (n.domId ? " id='" + esc(n.domId) + "'" : "") +
      Object.keys(n.data || {}).map(function (k) { return " data-" + k + "='" + esc(n.data[k]) + "'"; }).join("") + ">";
    if (n.href) out += "<a href='" + esc(n.href) + "'>";
    out += "<rect x='" + x.toFixed(1) + "' y='" + y.toFixed(1) + "' width='" + n.width + "' height='" + n.height +
      "' rx='4'" + (n.fill ? " style='fill:" + esc(n.fill) + "'" : "") + "><title>" + esc(n.title || "") + "</title></rect>";
    (n.lines || []).forEach(function (line, i) {
      out += "<text class='l" + i + "' x='" + (x + 6).toFixed(1) + "' y='" + (y + 14 + 13 * i).toFixed(1) + "'>" +
        esc(line) + "</text>";
    });
    if (n.href) out += "</a>";
    if (n.badge) {
      out += "<a class='badge' href='" + esc(n.badge.href) + "'><text x='" + (x + n.width - 5).toFixed(1) + "' y='" +
        (y + n.height - 6).toFixed(1) + "' text-anchor='end'>" + esc(n.badge.text) + "</text></a>";
    }
    return out + "</g>";
  }

  function edge(e, dx, dy) {
    var d = e.points.map(function (p, i) {
      return (i ? "L" : "M") + (p.x + dx).toFixed(1) + " " + (p.y + dy).toFixed(1);
    }).join("");
    return "<g class='edge " + esc(e.cls || "") + "'><title>" + esc(e.title || "") + "</title><path d='" + d + "'/>" +
      arrowhead(e.points, dx, dy) + "</g>";
  }

  /* A filled triangle at the end of the last segment (no SVG marker: its id would repeat per drawing). */
  function arrowhead(points, dx, dy) {
    var end = points[points.length - 1], before = points[points.length - 2] || end;
    var ux = end.x - before.x, uy = end.y - before.y, length = Math.hypot(ux, uy) || 1;
    ux /= length; uy /= length;
    var corner = function (side) {
      return (end.x + dx - 7 * ux + side * 3.5 * uy).toFixed(1) + " " + (end.y + dy - 7 * uy - side * 3.5 * ux).toFixed(1);
    };
    return "<path class='head' d='M" + (end.x + dx).toFixed(1) + " " + (end.y + dy).toFixed(1) + "L" + corner(1) +
      "L" + corner(-1) + "z'/>";
  }

  /* The markup of a placed graph shifted by (dx, dy): edges first, so boxes cover their ends. */
  function markup(nodes, edges, dx, dy) {
    return edges.map(function (e) { return edge(e, dx, dy); }).join("") +
      nodes.filter(function (n) { return !n.hidden; }).map(function (n) { return box(n, dx, dy); }).join("");
  }

  function svg(width, height, body, label) {
    return "<svg xmlns='http://www.w3.org/2000/svg' class='graph' width='" + Math.ceil(width) + "' height='" +
      Math.ceil(height) + "' role='img' aria-label='" + esc(label) + "'>" + body + "</svg>";
  }

  return {esc: esc, layout: layout, markup: markup, svg: svg};
})();
