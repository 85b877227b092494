// The page at /: translate a sentence through POST /translate (with attention), then draw the
// weights of the chosen site, layer and head (or the mean over heads) as a table whose cells
// carry their weight (data-weight), or every layer x head of the site as small maps.
"use strict";

const $ = (id) => document.getElementById(id);
let result = null; // the attention of the last translation: {source, target, maps}

function option(select, value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  select.appendChild(o);
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function loadModel() {
  const summary = await (await fetch("/model")).json();
  $("backend").textContent = `decoded by ${summary.backend}`;
  const rows = [["checkpoints", summary.checkpoints.join("\n")]];
  if (summary.model) {
    const m = summary.model;
    rows.push(["layers", `encoder ${m.encoder_layers}, decoder ${m.decoder_layers}`]);
    rows.push(["size", `d_model ${m.d_model}, heads ${m.heads}, ffn ${m.ffn_dim}, ${m.norm}-norm`]);
    const a = m.attention;
    rows.push(["wiring", a.name]);
    for (const site of ["encoder_self", "decoder_self", "cross"]) {
      const s = a[site];
      rows.push([site, `Q from ${s.query}, K/V from ${s.key_value}, ${s.score}` +
        (s.heads ? `, ${s.heads} heads` : "")]);
    }
    if (a.layers.length) rows.push(["per-layer wiring", JSON.stringify(a.layers, null, 1)]);
  }
  const d = summary.decoding;
  rows.push(["decoding", `${d.search}, beam ${d.beam_size}, length penalty ${d.length_penalty}`]);
  if (!summary.attention) rows.push(["attention", "not available (export directory or ensemble)"]);
  const dl = $("summary");
  for (const [term, value] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dl.append(dt, dd);
  }
  $("beam").value = d.beam_size;
  $("nbest").value = d.nbest;
  // a multilingual model: the language to translate into, the server's default first
  for (const lang of summary.target_languages) option($("target"), lang, lang);
  if (d.target_lang) $("target").value = d.target_lang;
  $("target-label").hidden = !summary.target_languages.length;
  return summary;
}

function selectedMap() {
  const site = $("site").value, layer = Number($("layer").value);
  return result.maps.find((m) => m.site === site && m.layer === layer);
}

// The (Q, K) matrix of one head of a map, or the mean over heads ("mean"); for a map per
// target prefix, the chosen prefix's.
function matrix(map, head) {
  let heads = map.weights;
  if (map.per_prefix) heads = heads.map((h) => h[Number($("step").value)]);
  if (head !== "mean") return heads[Number(head)];
  return heads[0].map((row, i) =>
    row.map((_, j) => heads.reduce((sum, h) => sum + h[i][j], 0) / heads.length));
}

function labels(map) {
  return {
    rows: map.query === "source" ? result.source : result.target,
    columns: map.key === "source" ? result.source : result.target,
  };
}

function colour(weight) {
  const shade = Math.round(255 * (1 - weight));
  return `rgb(${shade}, ${shade}, 255)`;
}

function drawTable(map) {
  const values = matrix(map, $("head").value);
  const { rows, columns } = labels(map);
  const table = document.createElement("table");
  table.className = "heatmap";
  table.id = "heatmap";
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  for (const c of columns) {
    const th = document.createElement("th");
    th.textContent = c;
    head.appendChild(th);
  }
  const body = table.createTBody();
  values.forEach((row, i) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = rows[i];
    tr.appendChild(th);
    row.forEach((weight, j) => {
      const td = tr.insertCell();
      td.dataset.weight = String(weight);
      td.dataset.row = i;
      td.dataset.column = j;
      td.style.background = colour(weight);
      td.title = `${rows[i]} \u2192 ${columns[j]}: ${weight.toFixed(4)}`;
      td.addEventListener("mouseenter", () => { $("hover").textContent = td.title; });
    });
  });
  $("map").replaceChildren(table);
}

function drawGrid(site) {
  const maps = result.maps.filter((m) => m.site === site);
  const heads = maps[0].weights.length;
  const grid = $("grid");
  grid.style.gridTemplateColumns = `repeat(${heads}, max-content)`;
  grid.replaceChildren();
  for (const map of maps) {
    for (let h = 0; h < heads; h++) {
      const values = matrix(map, String(h));
      const cell = 6;
      const canvas = document.createElement("canvas");
      canvas.width = values[0].length * cell;
      canvas.height = values.length * cell;
      const context = canvas.getContext("2d");
      values.forEach((row, i) => row.forEach((weight, j) => {
        context.fillStyle = colour(weight);
        context.fillRect(j * cell, i * cell, cell, cell);
      }));
      const figure = document.createElement("figure");
      const caption = document.createElement("figcaption");
      caption.textContent = `layer ${map.layer + 1}, head ${h + 1}`;
      figure.append(canvas, caption);
      figure.addEventListener("click", () => {
        $("layer").value = String(map.layer);
        $("head").value = String(h);
        document.querySelector("input[name=view][value=one]").checked = true;
        draw();
      });
      grid.appendChild(figure);
    }
  }
}

function draw() {
  const map = selectedMap();
  const { rows, columns } = labels(map);
  $("step-label").hidden = !map.per_prefix;
  $("axes").textContent = `rows: queries from the ${map.query} (${rows.length}); ` +
    `columns: keys/values from the ${map.key} (${columns.length})` +
    (map.per_prefix ? "; one map per target prefix" : "");
  const all = document.querySelector("input[name=view]:checked").value === "all";
  $("map").hidden = all;
  $("grid").hidden = !all;
  if (all) drawGrid(map.site);
  else drawTable(map);
}

function fillLayers() {
  const site = $("site").value;
  const previous = $("layer").value;
  $("layer").replaceChildren();
  for (const m of result.maps.filter((m) => m.site === site)) option($("layer"), m.layer, m.layer + 1);
  if ([...$("layer").options].some((o) => o.value === previous)) $("layer").value = previous;
  fillHeads();
}

function fillHeads() {
  const map = selectedMap();
  const previous = $("head").value;
  $("head").replaceChildren();
  option($("head"), "mean", "mean of heads");
  map.weights.forEach((_, h) => option($("head"), h, h + 1));
  $("head").value = [...$("head").options].some((o) => o.value === previous) ? previous : "0";
  $("step").replaceChildren();
  if (map.per_prefix) {
    result.target.forEach((token, t) => option($("step"), t, `${t + 1}: ${token}`));
    $("step").value = String(result.target.length - 1);
  }
  draw();
}

function showAttention(attention) {
  result = attention;
  $("attention").hidden = !attention;
  if (!attention) return;
  const previous = $("site").value;
  $("site").replaceChildren();
  for (const site of [...new Set(attention.maps.map((m) => m.site))]) option($("site"), site, site);
  if ([...$("site").options].some((o) => o.value === previous)) $("site").value = previous;
  fillLayers();
}

async function translate(event, summary) {
  event.preventDefault();
  const body = {
    sentences: [$("source").value],
    decoding: { beam_size: Number($("beam").value), nbest: Number($("nbest").value) },
    attention: summary.attention,
  };
  if (summary.target_languages.length) body.decoding.target_lang = $("target").value;
  setStatus("translating\u2026", false);
  const response = await fetch("/translate", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) {
    setStatus(answer.error, true);
    return;
  }
  const nbest = answer.translations[0];
  $("translation").textContent = nbest[0].text;
  $("nbest").replaceChildren();
  if (nbest.length > 1) {
    for (const t of nbest) {
      const li = document.createElement("li");
      li.textContent = `${t.text} (${t.score.toFixed(3)})`;
      $("nbest").appendChild(li);
    }
  }
  $("output").hidden = false;
  showAttention(answer.attention ? answer.attention[0] : null);
  setStatus("", false);
  document.body.dataset.translated = String(Number(document.body.dataset.translated || 0) + 1);
}

loadModel().then((summary) => {
  $("form").addEventListener("submit", (event) => translate(event, summary));
  $("site").addEventListener("change", fillLayers);
  $("layer").addEventListener("change", fillHeads);
  $("head").addEventListener("change", draw);
  $("step").addEventListener("change", draw);
  for (const r of document.querySelectorAll("input[name=view]")) r.addEventListener("change", draw);
  document.body.dataset.ready = "true";
});
