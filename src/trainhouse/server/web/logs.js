// Log panes: ANSI colour codes to styled spans, HTML kept as text, live appends.
import { LOG_MAX_LINES, h } from "./core.js";

export const ANSI_COLORS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];

export function xterm256(n) {
  if (n < 16) return null; // one of the named classes
  if (n >= 232) {
    const g = 8 + (n - 232) * 10;
    return `rgb(${g},${g},${g})`;
  }
  const c = n - 16;
  const level = (v) => (v === 0 ? 0 : 55 + v * 40);
  return `rgb(${level(Math.floor(c / 36))},${level(Math.floor(c / 6) % 6)},${level(c % 6)})`;
}

/** Turns text with ANSI SGR codes into spans (classes ansi-*); other escapes are dropped. */
export class AnsiRenderer {
  constructor() {
    this.reset();
  }

  reset() {
    this.fg = null; // a class ("ansi-red") or a css colour ("rgb(...)")
    this.bg = null;
    this.bold = false;
    this.dim = false;
    this.italic = false;
    this.underline = false;
    this.inverse = false;
  }

  copy() {
    return Object.assign(new AnsiRenderer(), this);
  }

  color(codes, i, bg) {
    // 38;5;n or 38;2;r;g;b: returns [value, codes consumed after the 38/48]
    if (codes[i + 1] === 5 && codes.length > i + 2) {
      const n = codes[i + 2];
      const name = n < 8 ? ANSI_COLORS[n] : n < 16 ? `bright-${ANSI_COLORS[n - 8]}` : null;
      return [name ? `ansi-${bg ? "bg-" : ""}${name}` : xterm256(n), 2];
    }
    if (codes[i + 1] === 2 && codes.length > i + 4) {
      return [`rgb(${codes[i + 2]},${codes[i + 3]},${codes[i + 4]})`, 4];
    }
    return [null, 0];
  }

  apply(params) {
    const codes = params === "" ? [0] : params.split(";").map((p) => (p === "" ? 0 : Number(p)));
    for (let i = 0; i < codes.length; i += 1) {
      const c = codes[i];
      if (c === 0) this.reset();
      else if (c === 1) this.bold = true;
      else if (c === 2) this.dim = true;
      else if (c === 3) this.italic = true;
      else if (c === 4) this.underline = true;
      else if (c === 7) this.inverse = true;
      else if (c === 22) this.bold = this.dim = false;
      else if (c === 23) this.italic = false;
      else if (c === 24) this.underline = false;
      else if (c === 27) this.inverse = false;
      else if (c >= 30 && c <= 37) this.fg = `ansi-${ANSI_COLORS[c - 30]}`;
      else if (c >= 90 && c <= 97) this.fg = `ansi-bright-${ANSI_COLORS[c - 90]}`;
      else if (c >= 40 && c <= 47) this.bg = `ansi-bg-${ANSI_COLORS[c - 40]}`;
      else if (c >= 100 && c <= 107) this.bg = `ansi-bg-bright-${ANSI_COLORS[c - 100]}`;
      else if (c === 39) this.fg = null;
      else if (c === 49) this.bg = null;
      else if (c === 38 || c === 48) {
        const [value, used] = this.color(codes, i, c === 48);
        if (c === 38) this.fg = value;
        else this.bg = value;
        i += used;
      }
    }
  }

  styled() {
    return this.fg || this.bg || this.bold || this.dim || this.italic || this.underline || this.inverse;
  }

  text(frag, s) {
    if (!s) return;
    if (!this.styled()) {
      frag.append(document.createTextNode(s));
      return;
    }
    const span = document.createElement("span");
    const classes = [];
    const style = [];
    for (const [value, prop] of [[this.fg, "color"], [this.bg, "background-color"]]) {
      if (!value) continue;
      if (value.startsWith("ansi-")) classes.push(value);
      else style.push(`${prop}:${value}`);
    }
    if (this.bold) classes.push("ansi-bold");
    if (this.dim) classes.push("ansi-dim");
    if (this.italic) classes.push("ansi-italic");
    if (this.underline) classes.push("ansi-underline");
    if (this.inverse) classes.push("ansi-inverse");
    if (classes.length) span.className = classes.join(" ");
    if (style.length) span.setAttribute("style", style.join(";"));
    span.textContent = s;
    frag.append(span);
  }

  /** A fragment for text (no partial escapes in it); advances the colour state. */
  render(text) {
    const frag = document.createDocumentFragment();
    // SGR, other CSI sequences, OSC strings, and two-character escapes
    const re = /\x1b\[([0-9;?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]/g;
    let at = 0;
    for (const m of text.matchAll(re)) {
      this.text(frag, text.slice(at, m.index));
      if (m[2] === "m") this.apply(m[1]);
      at = m.index + m[0].length;
    }
    this.text(frag, text.slice(at));
    return frag;
  }
}

/** A carriage return rewrites its line: keep what was written last (but not the codes before). */
export function overwriteCR(line) {
  const body = line.replace(/\r+$/, "");
  const cr = body.lastIndexOf("\r");
  if (cr < 0) return body;
  const codes = body.slice(0, cr).match(/\x1b\[[0-9;]*m/g) || [];
  return codes.join("") + body.slice(cr + 1);
}

/** A log pane: appends text as it arrives, colours kept, HTML escaped, old lines trimmed. */
export class LogView {
  constructor(el) {
    this.el = el;
    this.ansi = new AnsiRenderer();
    this.partial = "";
    this.partialEl = null;
    this.chunks = []; // [element, lines]
    this.lines = 0;
  }

  append(text) {
    const stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 24;
    const data = this.partial + text;
    const cut = data.lastIndexOf("\n");
    const complete = cut >= 0 ? data.slice(0, cut + 1) : "";
    this.partial = data.slice(cut + 1);
    if (this.partialEl) {
      this.partialEl.remove();
      this.partialEl = null;
    }
    if (complete) {
      const lines = complete.split("\n");
      lines.pop();
      const chunk = h("span", { class: "chunk" }, this.ansi.render(lines.map(overwriteCR).join("\n") + "\n"));
      this.el.append(chunk);
      this.chunks.push([chunk, lines.length]);
      this.lines += lines.length;
      while (this.lines > LOG_MAX_LINES && this.chunks.length > 1) {
        const [old, n] = this.chunks.shift();
        old.remove();
        this.lines -= n;
      }
    }
    if (this.partial && !/\x1b[^a-zA-Z]*$/.test(this.partial)) {
      // the line being written: drawn with a copy of the colour state, redrawn next time
      this.partialEl = h("span", { class: "partial" }, this.ansi.copy().render(overwriteCR(this.partial)));
      this.el.append(this.partialEl);
    }
    if (stick) this.el.scrollTop = this.el.scrollHeight;
  }

  note(text) {
    this.el.append(h("span", { class: "note" }, text + "\n"));
  }
}
