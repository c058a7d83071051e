"use strict";
/* The finding pictures of `qdq lint --format html` and `qdq fix --report-html`: each picture's boxes
   and edges come from the page's JSON (#onnx-pictures-data); dagre places them, top to bottom. */
(function () {
  var pictures = JSON.parse(document.getElementById("onnx-pictures-data").textContent);
  var started = performance.now();
  pictures.forEach(function (p) {
    var nodes = p.nodes.map(function (n) { return Object.assign({width: 196, height: n.lines.length > 2 ? 46 : 34}, n); });
    var edges = p.edges.map(function (e) { return {from: e[0], to: e[1], title: e[2], cls: e[3]}; });
    var size = QdqGraph.layout(nodes, edges, {nodesep: 14, ranksep: 22});
    document.getElementById(p.holder).innerHTML =
      QdqGraph.svg(size.width, size.height, QdqGraph.markup(nodes, edges, 0, 0), p.label);
  });
  document.body.setAttribute("data-render-ms", (performance.now() - started).toFixed(0));
})();
