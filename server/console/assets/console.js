// trainerd's web console: plain ES2017, no library, no build step.
// Every string from the daemon reaches the page as text (text nodes, setAttribute); nothing is
// ever parsed as HTML, and the page runs under a CSP without inline scripts or styles.
'use strict';
(function() {

// ---- Text and elements ----

// Control characters (but \n and \t), DEL, C1 controls and bidi marks, shown as visible
// escapes in the daemon's own form (common/safe_text.cc): \x1b, \u202e.
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
function clean(v) {
  return String(v).replace(CONTROL, c => {
    const n = c.charCodeAt(0);
    return n < 0x20 || n === 0x7f ? '\\x' + n.toString(16).padStart(2, '0') :
                                    '\\u' + n.toString(16).padStart(4, '0');
  });
}

const SVG_NS = 'http://www.w3.org/2000/svg';
const PROPS = ['value', 'checked', 'disabled', 'hidden'];

// Functions become listeners, a few keys properties, the rest attributes. Inline handlers and
// style attributes are refused (the CSP would block them anyway).
function setAttrs(el, attrs) {
  for (const k in attrs || {}) {
    const v = attrs[k];
    if (v == null || v === false) continue;
    if (typeof v === 'function')
      el.addEventListener(k.replace(/^on/, ''), v);
    else if (PROPS.includes(k) && !(el instanceof SVGElement))
      el[k] = v;
    else if (/^on|^style$/i.test(k))
      throw new Error('refused attribute ' + k);
    else
      el.setAttribute(k, v === true ? '' : k === 'title' ? clean(v) : String(v));
  }
}
// Appends nodes, strings (as text nodes) and arrays of them; null and false are skipped.
function add(el, kids) {
  for (const k of kids) {
    if (k == null || k === false) continue;
    if (Array.isArray(k))
      add(el, k);
    else
      el.appendChild(k instanceof Node ? k : document.createTextNode(clean(k)));
  }
  return el;
}
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  return add(el, kids);
}
function s(tag, attrs, ...kids) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  return add(el, kids);
}
function fill(el, ...kids) {
  el.textContent = '';
  return add(el, kids);
}
const $ = id => document.getElementById(id);
const td = (cls, ...kids) => h('td', cls ? {class: cls} : null, kids);
const span = (cls, ...kids) => h('span', cls ? {class: cls} : null, kids);
const div = (cls, ...kids) => h('div', cls ? {class: cls} : null, kids);
const tag = (text, cls) => span('tag' + (cls ? ' ' + cls : ''), text);
const card = (title, ...kids) => h('section', {class: 'card'}, title && h('h2', null, title), kids);
const emptyRow = (cols, text) => h('tr', {class: 'empty'}, h('td', {colspan: cols}, text));
const jobHref = id => '#/jobs/' + encodeURIComponent(id);
const sweepHref = id => '#/sweeps/' + encodeURIComponent(id);
const jobLink = id => h('a', {href: jobHref(id), class: 'mono'}, id);

// A definition list of [label, value] rows; rows whose value is null, false or '' are left out.
function dl(attrs, rows) {
  const el = h('dl', Object.assign({class: 'kv'}, attrs));
  for (const r of rows) {
    if (r[1] == null || r[1] === false || r[1] === '') continue;
    add(el, [h('dt', null, r[0]), h('dd', null, r[1])]);
  }
  return el;
}
function table(attrs, heads, rows) {
  return h(
      'table', Object.assign({class: 'grid'}, attrs),
      h('thead', null, h('tr', null, heads.map(t => h('th', null, t)))), h('tbody', null, rows));
}

// ---- Numbers, times, enums ----

// int64 arrive as strings, non-finite doubles as "NaN" and "Infinity".
const num = v => v == null || v === '' ? NaN : Number(v);
const pos = v => num(v) > 0;
const sig = (x, p) => String(Number(x.toPrecision(p || 3)));
function fmtLoss(v) {
  const x = num(v);
  return v == null || v === '' ? '—' : Number.isFinite(x) ? x.toPrecision(4) : String(x);
}
function fmtSI(v, unit) {
  const x = num(v), P = ['', 'k', 'M', 'G', 'T', 'P', 'E'];
  if (!Number.isFinite(x)) return '—';
  let i = 0;
  while (i < 6 && Math.abs(x) >= Math.pow(1000, i + 1)) i++;
  const n = sig(x / Math.pow(1000, i));
  return unit ? n + ' ' + P[i] + unit : n + P[i];
}
function fmtInt(v) {
  const x = num(v);
  return !Number.isFinite(x) ? '—' : Math.abs(x) < 1e6 ? x.toLocaleString('en-US') : fmtSI(x);
}
function fmtBytes(v) {
  const U = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let x = num(v), i = 0;
  if (!Number.isFinite(x)) return '—';
  while (i < 5 && x >= 1024) {
    x /= 1024;
    i++;
  }
  return (i ? sig(x) : String(x)) + ' ' + U[i];
}
function fmtPct(v) {
  const x = num(v);
  return Number.isFinite(x) ? (x * 100).toFixed(x < 0.1 ? 1 : 0) + '%' : '—';
}
function fmtSeconds(v) {
  const x = num(v), p = n => String(Math.floor(n)).padStart(2, '0');
  if (!Number.isFinite(x)) return '—';
  if (x === 0) return '0 s';
  if (x < 1e-3) return sig(x * 1e6) + ' µs';
  if (x < 1) return sig(x * 1e3) + ' ms';
  if (x < 60) return sig(x) + ' s';
  if (x < 3600) return Math.floor(x / 60) + ' m ' + p(x % 60) + ' s';
  return Math.floor(x / 3600) + ' h ' + p(x % 3600 / 60) + ' m';
}
// Axis labels: short, in exponent form for very large or small values.
function fmtTick(v) {
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(1).replace('.0e', 'e') : sig(v, 4);
}
// Timestamps are RFC 3339 with up to nanoseconds; unset ones are absent (or the epoch).
function parseTime(ts) {
  if (!ts) return null;
  const d = new Date(String(ts).replace(/(\.\d{3})\d+/, '$1'));
  return isNaN(d.getTime()) || d.getTime() <= 0 ? null : d;
}
function timeEl(ts) {
  const d = parseTime(ts), p = n => String(n).padStart(2, '0');
  if (!d) return '—';
  return h(
      'time', {datetime: d.toISOString(), title: d.toString()},
      `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
          `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`);
}

const ENUM_PREFIXES = [
  'JOB_STATE_', 'LOSS_', 'OPTIMIZER_KIND_', 'PRECISION_', 'JOB_PRIORITY_', 'ENGINE_',
  'EARLY_STOP_METRIC_', 'MODEL_FROM_', 'DTYPE_', 'DATASET_LOCATION_'
];
function enumText(v) {
  let t = String(v);
  for (const p of ENUM_PREFIXES)
    if (t.startsWith(p)) {
      t = t.slice(p.length);
      break;
    }
  return t.toLowerCase();
}
const isEnum = v => typeof v === 'string' && /^[A-Z][A-Z0-9_]*$/.test(v);
const stateName = st => String(st || 'JOB_STATE_UNSPECIFIED').replace(/^JOB_STATE_/, '');
const ENDED = ['JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_CANCELLED'];
const isEnded = st => ENDED.includes(st);
function badge(st, id) {
  const n = stateName(st);
  return h('span', {id, class: 'state state-' + n.toLowerCase()}, n);
}

// A message's scalar fields by dotted path ("optimizer.learning_rate"), lists joined, in order.
function flatten(obj, prefix, out) {
  out = out || {};
  for (const k of Object.keys(obj || {})) {
    const v = obj[k], p = prefix ? prefix + '.' + k : k;
    if (v && typeof v === 'object' && !Array.isArray(v))
      flatten(v, p, out);
    else if (!Array.isArray(v))
      out[p] = v;
    else
      out[p] = v.map(x => typeof x === 'object' ? JSON.stringify(x) : x).join(', ');
  }
  return out;
}
const isDefault = v => v == null || v === 0 || v === '' || v === '0' || v === false ||
    (isEnum(v) && /UNSPECIFIED$/.test(v));
const valueText = v => typeof v === 'boolean' ? (v ? 'yes' : 'no') :
    isEnum(v)                                 ? enumText(v) :
                                                String(v);

// ---- The API ----

const TOKEN_KEY = 'trainerd.token';
let token = sessionStorage.getItem(TOKEN_KEY) || '';
let authed = false;
function setToken(t) {
  token = t;
  if (t)
    sessionStorage.setItem(TOKEN_KEY, t);
  else
    sessionStorage.removeItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(code, message, status) {
    super(message || code);
    this.code = code;
    this.status = status;
  }
}
const STATUS_CODES = {
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  403: 'PERMISSION_DENIED',
  404: 'NOT_FOUND',
  429: 'RESOURCE_EXHAUSTED',
  503: 'UNAVAILABLE'
};

function request(path, body, signal) {
  const headers = {'Content-Type': 'application/json'};
  if (token) headers.Authorization = 'Bearer ' + token;
  return fetch('/api/v1/' + path, {
           method: 'POST',
           headers,
           body: JSON.stringify(body || {}),
           signal,
           cache: 'no-store',
           credentials: 'same-origin'
         })
      .catch(e => {
        if (e.name === 'AbortError') throw e;
        throw new ApiError('UNAVAILABLE', 'cannot reach trainerd (' + e.message + ')', 0);
      });
}
// The error of a non-200 reply; a 401 also forgets the token and shows the login view.
async function failure(res) {
  let body = null;
  try {
    body = JSON.parse(await res.text());
  } catch (e) { /* not JSON: the status says it */
  }
  const err = new ApiError(
      (body && body.code) || STATUS_CODES[res.status] || 'INTERNAL',
      (body && body.message) || res.statusText || 'HTTP ' + res.status, res.status);
  if (res.status === 401) refused(err);
  return err;
}
async function api(path, body, signal) {
  const res = await request(path, body, signal);
  if (!res.ok) throw await failure(res);
  const text = await res.text();
  return text ? JSON.parse(text) : {};
}

// The formats DownloadModel sends: [format, file extension, button label].
const MODEL_FORMATS = [
  ['MODEL_FORMAT_TORCHSCRIPT', '.pt', 'TorchScript (.pt)'],
  ['MODEL_FORMAT_SAFETENSORS', '.safetensors', 'state_dict (.safetensors)'],
  ['MODEL_FORMAT_PT2', '.pt2', 'exported program (.pt2)'],
];
// DownloadModel through the console: fetched with the token (a link cannot send it), then saved
// from a blob under the job's id.
async function downloadModel(id, format, ext, button) {
  button.disabled = true;
  try {
    const res = await request('JobService/DownloadModel', {id, format});
    if (!res.ok) throw await failure(res);
    const url = URL.createObjectURL(await res.blob());
    const link = h('a', {href: url, download: id + ext, hidden: true});
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (e) {
    report(e);
  } finally {
    button.disabled = false;
  }
}

// WatchJob as server-sent events over fetch (EventSource cannot send headers): calls onEvent
// with each JobEvent; resolves when the stream ends, throws its error event as an ApiError.
async function watchJob(id, signal, onEvent) {
  const res = await request('JobService/WatchJob', {id}, signal);
  if (!res.ok) throw await failure(res);
  const reader = res.body.getReader(), dec = new TextDecoder(), blank = /\r?\n\r?\n/;
  let buf = '';
  for (;;) {
    const r = await reader.read();
    if (r.done) return;
    buf += dec.decode(r.value, {stream: true});
    let m;
    while ((m = blank.exec(buf))) {
      const block = buf.slice(0, m.index), data = [];
      buf = buf.slice(m.index + m[0].length);
      let event = 'message';
      for (const line of block.split(/\r?\n/)) {
        const i = line.indexOf(':'), field = i < 0 ? line : line.slice(0, i);
        const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
        if (field === 'event')
          event = value;
        else if (field === 'data')
          data.push(value);
      }
      if (!data.length) continue;  // a comment (keep-alive)
      const msg = JSON.parse(data.join('\n'));
      if (event === 'error') {
        const err = new ApiError(msg.code || 'INTERNAL', msg.message, 0);
        if (err.code === 'UNAUTHENTICATED') refused(err);
        throw err;
      }
      onEvent(msg);
    }
  }
}

// ---- Banner, page lifecycle, polling ----

// An error in the banner; a 'poll' error is cleared by the next refresh that succeeds.
function report(e, source) {
  if (!e || e.silent || e.name === 'AbortError') return;
  const b = $('error-banner');
  fill(b, e.message || String(e));
  b.setAttribute('data-code', e.code || '');
  b.setAttribute('data-source', source || 'action');
  b.hidden = false;
}
function clearBanner(source) {
  const b = $('error-banner');
  if (!source || b.getAttribute('data-source') === source) {
    b.hidden = true;
    b.textContent = '';
  }
}

// The page on screen: its fetches and timers end when the route changes or the user logs out.
let page = null;
function stopPage() {
  if (!page) return;
  page.stopped = true;
  page.ctl.abort();
  page.timers.forEach(clearTimeout);
  page = null;
}
function newPage() {
  stopPage();
  page = {ctl: new AbortController(), timers: new Set(), stopped: false, redraw: null};
  return page;
}
function later(pg, ms, fn) {
  const t = setTimeout(() => {
    pg.timers.delete(t);
    if (!pg.stopped) fn();
  }, ms);
  pg.timers.add(t);
  return t;
}
const sleep = (pg, ms) => new Promise(resolve => later(pg, ms, resolve));
// Runs fn now and every ms after it settles while pg is shown; fn returning false stops it.
// A hidden tab skips the calls.
function poll(pg, ms, fn) {
  const tick = async () => {
    let more = true;
    if (!document.hidden) {
      try {
        more = (await fn()) !== false;
        if (!pg.stopped) clearBanner('poll');
      } catch (e) {
        if (pg.stopped) return;
        report(e, 'poll');
      }
    }
    if (more && !pg.stopped) later(pg, ms, tick);
  };
  tick();
}
const refresh = fn => fn().then(() => clearBanner('poll'), e => report(e, 'poll'));

// ---- Log in ----

function refused(err) {
  err.silent = true;
  const had = !!token;
  setToken('');
  showLogin(had ? err.message : '');
}
function showLogin(message) {
  authed = false;
  stopPage();
  $('loading').hidden = $('app-view').hidden = true;
  $('login-view').hidden = false;
  fill($('login-error'), message || '');
  $('login-error').hidden = !message;
  $('login-token').focus();
  $('login-token').select();
}
function showApp(v) {
  authed = true;
  $('loading').hidden = $('login-view').hidden = true;
  $('app-view').hidden = false;
  $('logout').hidden = !token;  // a daemon without tokens has nothing to log out of
  fill($('version'), v && v.trainerd_version ? 'v' + v.trainerd_version : '');
  if (v) {
    $('version').setAttribute(
        'title', clean([
          'LibTorch ' + v.libtorch_version, v.cuda_version && 'CUDA ' + v.cuda_version,
          v.driver_version && 'driver ' + v.driver_version
        ].filter(Boolean).join(' · ')));
  }
  route();
}
// Asks GetVersion: a 401 shows the login view (through failure()), anything else the app.
async function start() {
  try {
    showApp(await api('SystemService/GetVersion', {}));
  } catch (e) {
    if (e.silent) return;
    showApp(null);
    report(e);
  }
}
async function logIn(ev) {
  ev.preventDefault();
  const t = $('login-token').value.trim();
  if (!t) return showLogin('Enter a token.');
  setToken(t);
  $('login-submit').disabled = true;
  try {
    await start();
  } finally {
    $('login-submit').disabled = false;
  }
}
function logOut() {
  setToken('');
  $('login-token').value = '';
  showLogin('');
}

// ---- Routing ----

function route() {
  if (!authed) return;
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(p => {
    try {
      return decodeURIComponent(p);
    } catch (e) {
      return p;
    }
  });
  const top = parts[0] || 'jobs', arg = parts.slice(1).join('/');
  const nav = top === 'sweeps' ? 'jobs' : top;
  clearBanner();
  const pg = newPage(), view = $('view');
  view.textContent = '';
  for (const n of ['jobs', 'datasets', 'devices']) {
    $('nav-' + n).classList.toggle('active', n === nav);
    if (n === nav)
      $('nav-' + n).setAttribute('aria-current', 'page');
    else
      $('nav-' + n).removeAttribute('aria-current');
  }
  document.title = 'trainerd · ' + clean(arg || top);
  if (top === 'jobs' && arg)
    jobPage(pg, view, arg);
  else if (top === 'sweeps' && arg)
    sweepPage(pg, view, arg);
  else if (top === 'datasets')
    datasetsPage(pg, view);
  else if (top === 'devices')
    devicesPage(pg, view);
  else
    jobsPage(pg, view);
}

// ---- Charts ----

// Rounded tick values between a and b, about n of them (whole numbers only when integer).
function niceTicks(a, b, n, integer) {
  const raw = (b - a) / n;
  if (!(raw > 0) || !Number.isFinite(raw)) return [a];
  const mag = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / mag;
  let step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = Math.ceil(a / step) * step; v <= b + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

// Draws line series into an <svg>: grid, tick labels, one <path> per series with a gap where a
// value is not finite. series: [{cls, pts: [[x, y]...], attrs, title}]; o: {height, log, empty}.
function drawChart(svg, series, o) {
  o = o || {};
  // One user unit per pixel, so that labels keep their size; 640 while the chart is not laid out.
  const W = Math.round(svg.getBoundingClientRect().width) || 640, H = o.height || 220;
  const m = {l: 56, r: 12, t: 8, b: 22};
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.textContent = '';
  svg.chartInfo = null;
  const ok = p => Number.isFinite(p[0]) && Number.isFinite(p[1]) && (!o.log || p[1] > 0);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const se of series) {
    for (const p of se.pts.filter(ok)) {
      x0 = Math.min(x0, p[0]);
      x1 = Math.max(x1, p[0]);
      y0 = Math.min(y0, p[1]);
      y1 = Math.max(y1, p[1]);
    }
  }
  if (x0 > x1) {
    svg.appendChild(
        s('text', {x: W / 2, y: H / 2, class: 'empty', 'text-anchor': 'middle'}, o.empty));
    return;
  }
  if (x0 === x1) {
    x0 -= 0.5;
    x1 += 0.5;
  }
  const f = o.log ? Math.log10 : v => v;
  let f0 = f(y0), f1 = f(y1);
  const pad = f0 === f1 ? Math.abs(f0) * 0.1 || 1 : (f1 - f0) * 0.05;
  f0 -= pad;
  f1 += pad;
  const X = v => m.l + (v - x0) / (x1 - x0) * (W - m.l - m.r);
  const Y = v => m.t + (f1 - f(v)) / (f1 - f0) * (H - m.t - m.b);
  const axes = s('g', {class: 'axes'});
  let yt = niceTicks(f0, f1, Math.max(3, Math.round(H / 50)));
  if (o.log) {
    // Whole decades when the range spans two or more; otherwise plain values within it.
    const dec = [];
    for (let k = Math.ceil(f0); k <= f1; k++) dec.push(Math.pow(10, k));
    yt =
        dec.length >= 2 ? dec : niceTicks(Math.pow(10, f0), Math.pow(10, f1), 4).filter(v => v > 0);
  }
  for (const v of yt) {
    const y = Y(v).toFixed(1);
    add(axes, [
      s('line', {class: 'grid', x1: m.l, x2: W - m.r, y1: y, y2: y}),
      s('text', {class: 'tick', x: m.l - 5, y: Number(y) + 3.5, 'text-anchor': 'end'}, fmtTick(v))
    ]);
  }
  for (const v of niceTicks(Math.ceil(x0), Math.floor(x1), Math.max(2, Math.round(W / 90)), true)) {
    const x = X(v).toFixed(1);
    add(axes, [
      s('line', {class: 'tickmark', x1: x, x2: x, y1: H - m.b, y2: H - m.b + 4}),
      s('text', {class: 'tick', x, y: H - m.b + 15, 'text-anchor': 'middle'}, fmtTick(v))
    ]);
  }
  add(axes, [
    s('line', {class: 'axis', x1: m.l, x2: m.l, y1: m.t, y2: H - m.b}),
    s('line', {class: 'axis', x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b})
  ]);
  svg.appendChild(axes);
  for (const se of series) {
    let d = '', pen = false, n = 0;
    for (const p of se.pts) {
      if (!ok(p)) {
        pen = false;
        continue;
      }
      d += (pen ? 'L' : 'M') + X(p[0]).toFixed(1) + ' ' + Y(p[1]).toFixed(1);
      pen = true;
      n++;
    }
    if (n === 1) d += 'h0.1';  // one point: a dot (round caps)
    const path =
        s('path', Object.assign({class: se.cls}, se.attrs), se.title && s('title', null, se.title));
    if (d) path.setAttribute('d', d);
    svg.appendChild(path);
  }
  svg.chartInfo = {x0, x1, X, m, W, H};
}

// Shows describe(x) for the whole x under the pointer in `out`, with a cursor line.
function hover(svg, out, describe) {
  svg.addEventListener('mousemove', ev => {
    const c = svg.chartInfo, ctm = svg.getScreenCTM();
    if (!c || !ctm) return;
    const pt = svg.createSVGPoint();
    pt.x = ev.clientX;
    pt.y = ev.clientY;
    const p = pt.matrixTransform(ctm.inverse());
    const x = Math.round(c.x0 + (p.x - c.m.l) / (c.W - c.m.l - c.m.r) * (c.x1 - c.x0));
    const text = describe(x);
    if (!text) return fill(out);
    const line = svg.querySelector('line.cursor') || svg.appendChild(s('line', {class: 'cursor'}));
    const px = c.X(x).toFixed(1);
    setAttrs(line, {x1: px, x2: px, y1: c.m.t, y2: c.H - c.m.b});
    fill(out, text);
  });
  svg.addEventListener('mouseleave', () => {
    const line = svg.querySelector('line.cursor');
    if (line) line.remove();
    fill(out);
  });
}

// A horizontal bar for a fraction 0..1 (SVG: no style attribute needed).
function meter(frac) {
  const w = Number.isFinite(frac) ? Math.max(0, Math.min(1, frac)) * 100 : 0;
  return s(
      'svg', {
        class: 'meter' + (frac > 0.9 ? ' high' : ''),
        viewBox: '0 0 100 6',
        preserveAspectRatio: 'none'
      },
      s('rect', {class: 'track', width: 100, height: 6}),
      s('rect', {class: 'fill', width: w.toFixed(1), height: 6}));
}

// ---- Jobs ----

// The jobs list's filters and page, kept while the console is open.
const jobsQuery = {
  state: '',
  sweep: '',
  search: '',
  token: '',
  page: 1
};

function jobRow(j) {
  const spec = j.spec || {}, done = num(j.epochs_completed) || 0;
  return h(
      'tr', {'data-job-id': j.id}, td(null, jobLink(j.id)),
      td(null, badge(j.state), j.stopped_early && tag('early'),
         j.cancel_requested && !isEnded(j.state) && tag('cancelling')),
      j.record_damaged ?
          h('td', {colspan: 6, class: 'damaged'}, 'record damaged: ', j.record_damaged) :
          [
            h('td', {class: 'model mono', title: spec.model || ''}, spec.model),
            td(null, spec.dataset), td('num', done + ' / ' + (spec.epochs || 0)),
            td('num', done > 0 ? fmtLoss(j.final_loss) : '—'),
            td(null,
               j.sweep_id &&
                   h('a', {href: sweepHref(j.sweep_id)}, j.sweep_id + ' #' + j.sweep_member)),
            td(null, timeEl(j.create_time))
          ]);
}

function jobsPage(pg, view) {
  let jobs = [], next = '', seq = 0, debounce = 0;
  const states = ['', 'QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
  const stateSel = h('select', {id: 'jobs-state', 'aria-label': 'State'}, states.map(st => {
    const v = st && 'JOB_STATE_' + st;
    return h('option', {value: v, selected: jobsQuery.state === v}, st || 'any');
  }));
  const sweepIn = h('input', {
    id: 'jobs-sweep',
    type: 'search',
    placeholder: 'sweep id',
    value: jobsQuery.sweep,
    spellcheck: 'false',
    'aria-label': 'Sweep id'
  });
  const searchIn = h('input', {
    id: 'jobs-search',
    type: 'search',
    value: jobsQuery.search,
    placeholder: 'search id, model, dataset',
    'aria-label': 'Search'
  });
  const firstB = h('button', {id: 'jobs-first', type: 'button'}, 'First page');
  const nextB = h('button', {id: 'jobs-next', type: 'button'}, 'Next page');
  const pageNo = h('span', {id: 'jobs-page', class: 'muted'});
  const count = h('span', {id: 'jobs-count', class: 'muted'});
  const tbl = table(
      {id: 'jobs-table'},
      ['Id', 'State', 'Model', 'Dataset', 'Epochs', 'Final loss', 'Sweep', 'Created'], []);
  const tbody = tbl.tBodies[0];
  add(view, [
    div('page-head', h('h1', null, 'Jobs'), count),
    div('toolbar', stateSel, sweepIn, searchIn, span('spacer'), pageNo, firstB, nextB), tbl
  ]);

  // The search filters the loaded page only.
  const draw = () => {
    const q = jobsQuery.search.trim().toLowerCase();
    const shown = jobs.filter(j => !q || [
      j.id, (j.spec || {}).model, (j.spec || {}).dataset
    ].some(v => String(v || '').toLowerCase().includes(q)));
    fill(
        tbody,
        shown.length ? shown.map(jobRow) :
                       emptyRow(8, jobs.length ? 'No job on this page matches.' : 'No jobs.'));
    fill(count, q ? `${shown.length} of ${jobs.length}` : `${jobs.length} on this page`);
    fill(pageNo, 'page ' + jobsQuery.page);
    firstB.disabled = jobsQuery.page === 1;
    nextB.disabled = !next;
  };
  const load = async () => {
    const mine = ++seq, body = {page_size: 50, newest_first: true};
    if (jobsQuery.state) body.state = jobsQuery.state;
    if (jobsQuery.sweep) body.sweep_id = jobsQuery.sweep;
    if (jobsQuery.token) body.page_token = jobsQuery.token;
    const res = await api('JobService/ListJobs', body, pg.ctl.signal);
    if (mine !== seq) return;  // a newer load (other filters) answers instead
    jobs = res.jobs || [];
    next = res.next_page_token || '';
    draw();
  };
  const firstPage = () => {
    jobsQuery.token = '';
    jobsQuery.page = 1;
    refresh(load);
  };
  const sweepChanged = () => {
    clearTimeout(debounce);
    if (sweepIn.value.trim() === jobsQuery.sweep) return;
    jobsQuery.sweep = sweepIn.value.trim();
    firstPage();
  };
  stateSel.addEventListener('change', () => {
    jobsQuery.state = stateSel.value;
    firstPage();
  });
  sweepIn.addEventListener('input', () => {
    clearTimeout(debounce);
    debounce = later(pg, 350, sweepChanged);
  });
  sweepIn.addEventListener('change', sweepChanged);
  searchIn.addEventListener('input', () => {
    jobsQuery.search = searchIn.value;
    draw();
  });
  firstB.addEventListener('click', firstPage);
  nextB.addEventListener('click', () => {
    if (!next) return;
    jobsQuery.token = next;
    jobsQuery.page++;
    refresh(load);
  });
  poll(pg, 3000, load);
}

// Adds epochs to job.epochs (sorted by number), replacing any it has of the same number.
function mergeEpochs(job, list) {
  const eps = job.epochs || (job.epochs = []);
  for (const e of list || []) {
    const n = num(e.epoch);
    if (!eps.length || n > num(eps[eps.length - 1].epoch)) {
      eps.push(e);
      continue;
    }
    const i = eps.findIndex(x => num(x.epoch) >= n);
    if (num(eps[i].epoch) === n)
      eps[i] = e;
    else
      eps.splice(i, 0, e);
  }
  const last = eps[eps.length - 1];
  if (last && num(last.epoch) >= (num(job.epochs_completed) || 0)) {
    job.epochs_completed = num(last.epoch);
    job.final_loss = last.loss;
  }
}
// The job's last epoch that has `key` (validation_loss, validation_accuracy), or null.
function lastWith(job, key) {
  const eps = job.epochs || [];
  for (let i = eps.length - 1; i >= 0; i--)
    if (eps[i][key] != null) return eps[i];
  return null;
}
const lastValue = (job, key) => {
  const e = lastWith(job, key);
  return e ? num(e[key]) : NaN;
};

// The spec's main fields, always shown, with the text for an unset (default) value.
const SPEC_FIELDS = [
  ['model', 'model'], ['dataset', 'dataset'], ['loss', 'loss', 'by the targets'],
  ['optimizer.kind', 'optimizer', 'sgd'], ['optimizer.learning_rate', 'learning rate', '0.01'],
  ['batch_size', 'batch size', '32'], ['epochs', 'epochs', '10'], ['seed', 'seed'],
  ['device', 'device', 'default'], ['shuffle', 'shuffle'], ['precision', 'precision', 'fp32'],
  ['engine', 'engine', 'auto']
];

// The main fields, then every other field that is set.
function specList(spec) {
  const flat = flatten(spec), main = SPEC_FIELDS.map(f => f[0]);
  const rows = SPEC_FIELDS.map(f => {
    const v = flat[f[0]];
    if (isDefault(v) && f[2] && typeof v !== 'boolean') return [f[1], span('muted', f[2])];
    return [f[1], v == null ? '—' : valueText(v)];
  });
  for (const k of Object.keys(flat)) {
    if (!main.includes(k) && !isDefault(flat[k])) rows.push([k, valueText(flat[k])]);
  }
  return dl({id: 'job-spec'}, rows);
}

function sandboxText(w) {
  const mark = (ok, name) => name + (ok ? ' ✓' : ' ✗'), list = v => (v || []).join(', ');
  return [
    mark(w.landlock, 'landlock' + (w.landlock_abi ? ' (ABI ' + w.landlock_abi + ')' : '')),
    mark(w.seccomp, 'seccomp'), mark(w.no_new_privileges, 'no_new_privs'),
    mark(w.not_dumpable, 'not dumpable'), mark(w.network_namespace, 'netns'),
    'uid ' + w.uid + (w.other_user ? '' : ' (the daemon\'s)'),
    list(w.missing) && 'missing: ' + list(w.missing),
    list(w.accepted_missing) && 'accepted missing: ' + list(w.accepted_missing), w.refusal
  ].filter(Boolean)
      .join(' · ');
}

// Job.report's figures that are there.
function reportList(r) {
  const times = ['queue', 'data', 'compute', 'host_transfer']
                    .filter(k => pos(r[k + '_seconds']))
                    .map(k => k.replace('_', ' ') + ' ' + fmtSeconds(r[k + '_seconds']))
                    .join(', ');
  return dl({id: 'job-report-figures'}, [
    ['engine', r.engine && r.engine + (r.engine_reason ? ' (' + r.engine_reason + ')' : '')],
    ['bound', r.bound && !/UNSPECIFIED/.test(r.bound) && r.bound.toLowerCase().replace(/_/g, '-')],
    [
      'utilization',
      r.utilization_average != null &&
          fmtPct(r.utilization_average) + ' average, ' + fmtPct(r.utilization_peak) + ' peak'
    ],
    ['host syncs', r.host_syncs != null && fmtInt(r.host_syncs)],
    ['intra-op threads', pos(r.intra_op_threads) && String(r.intra_op_threads)], ['time', times],
    ['peak memory', pos(r.peak_memory_bytes) && fmtBytes(r.peak_memory_bytes)],
    ['steps / s', pos(r.steps_per_second) && fmtSI(r.steps_per_second)],
    ['FLOPs / step', pos(r.flops_per_step) && fmtSI(r.flops_per_step, 'FLOP')],
    ['achieved', pos(r.achieved_flops_per_second) && fmtSI(r.achieved_flops_per_second, 'FLOP/s')],
    ['of peak', r.peak_fraction != null && fmtPct(r.peak_fraction)],
    ['per-step overhead', r.overhead_fraction != null && fmtPct(r.overhead_fraction)],
    ['host → device', pos(r.host_to_device_bytes) && fmtBytes(r.host_to_device_bytes)],
    [
      'packed members',
      pos(r.packed_members) && r.packed_members + (r.packed_bitwise ? ', bitwise' : '')
    ],
    ['packed numerics', r.packed_numerics],
    ['worker start', pos(r.worker_start_seconds) && fmtSeconds(r.worker_start_seconds)],
    [
      'collectives',
      pos(r.collective_seconds) &&
          fmtSeconds(r.collective_seconds) +
              (r.collective_fraction != null ?
                   ' (' + fmtPct(r.collective_fraction) + ' of compute)' :
                   '')
    ],
    ['worker sandbox', r.worker_sandbox && sandboxText(r.worker_sandbox)]
  ]);
}

// The cards below the charts: ranks, restarts, checkpoints, model.
function jobExtras(job) {
  const id = job.id, out = [], cps = job.checkpoints || [], list = v => v || [];
  if (list(job.ranks).length) {
    out.push(card(
        'Ranks',
        table(
            {id: 'job-ranks'}, ['Rank', 'Device', 'Node', 'Job there'],
            job.ranks.map(
                k =>
                    h('tr', null, td('num', String(k.rank)), td(null, k.device), td(null, k.node),
                      td('mono', k.job_id || '—'))))));
  }
  if (list(job.restarts).length) {
    out.push(card(
        'Restarts',
        h('ul', {class: 'plain'},
          job.restarts.map(
              r =>
                  h('li', null, timeEl(r.time),
                    ' — was ' + stateName(r.previous_state) + ', went on from epoch ' +
                        (r.from_epoch || 0))))));
  }
  if (cps.length || pos((job.spec || {}).checkpoint_every)) {
    out.push(card(
        'Checkpoints',
        div('scroll',
            table(
                {id: 'job-checkpoints'}, ['Epoch', 'Path', 'Size', 'Written', 'SHA-256'],
                cps.length ?
                    cps.map(
                        c =>
                            h('tr', null, td('num', String(c.epoch)), td('mono', c.path),
                              td('num', fmtBytes(c.size_bytes)), td(null, timeEl(c.create_time)),
                              h('td', {class: 'mono', title: c.sha256 || ''},
                                (c.sha256 || '—').slice(0, 12)))) :
                    emptyRow(5, 'None yet.'))),
        cps.length > 0 &&
            h('pre', {class: 'hint'},
              `trainctl job checkpoint ${id} --epoch ${
                  cps[cps.length - 1].epoch} -f checkpoint.pt`)));
  }
  out.push(card(
      'Model',
      h('div', {id: 'job-model'},
        job.state === 'JOB_STATE_SUCCEEDED' ?
            [
              h('p', {class: 'downloads'},
                MODEL_FORMATS.map(
                    ([format, ext, label]) => h('button', {
                      type: 'button',
                      class: 'model-download',
                      'data-format': format,
                      onclick: ev => downloadModel(id, format, ext, ev.currentTarget)
                    },
                                                label))),
              h('pre', {class: 'hint'},
                `trainctl job model ${id} -f model.pt\n` +
                    `trainctl job model ${id} --format safetensors -f model.safetensors\n` +
                    `trainctl job model ${id} --format pt2 -f model.pt2`),
              dl(null,
                 [
                   ['weights of epoch', pos(job.model_epoch) && String(job.model_epoch)],
                   ['SHA-256', job.model_sha256]
                 ])
            ] :
            h('p', {class: 'muted'}, 'Only a job that succeeded has a model.'))));
  return div('columns', out);
}

function jobPage(pg, view, id) {
  let job = null, logScale = false, drawPending = false;
  const isLive = () => job && !isEnded(job.state);
  const stateEl = h('span', {id: 'job-state', class: 'state'}, '…');
  const flags = span('flags');
  const cancelB =
      h('button', {id: 'job-cancel', type: 'button', hidden: true, onclick: () => cancel()},
        'Cancel');
  const deleteB =
      h('button',
        {id: 'job-delete', type: 'button', class: 'danger', hidden: true, onclick: () => del()},
        'Delete');
  const errEl = h('p', {id: 'job-error', class: 'job-error', hidden: true});
  const notes = div('notes'), summary = div(), spec = div(), extra = div('extra');
  const reportBox = h('div', {id: 'job-report'});
  const epochsN = h('span', {id: 'job-epochs'}, '0');
  const valLegend =
      h('span', {class: 'legend-item', hidden: true}, h('i', {class: 'swatch validation'}),
        'validation');
  const logBox = h('input', {type: 'checkbox', id: 'loss-log'});
  const lossSvg = s('svg', {id: 'loss-chart', class: 'chart', role: 'img', 'aria-label': 'Loss'});
  const lrSvg =
      s('svg', {id: 'lr-chart', class: 'chart', role: 'img', 'aria-label': 'Learning rate'});
  const readout = span('readout'), lrReadout = span('readout');
  add(view, [
    div('page-head',
        h('h1', null, span('muted', 'Job '), h('span', {id: 'job-id', class: 'mono'}, id)), stateEl,
        flags, span('spacer'), cancelB, deleteB),
    errEl, notes,
    div('columns',
        card(
            null,
            div('chart-head', h('h2', null, 'Loss'), span('muted', epochsN, ' epochs'),
                span(
                    'legend', span('legend-item', h('i', {class: 'swatch train'}), 'training'),
                    valLegend),
                span('spacer'), h('label', {class: 'check'}, logBox, 'log scale')),
            lossSvg, div('readout-line', readout),
            div('chart-head', h('h2', null, 'Learning rate')), lrSvg,
            div('readout-line', lrReadout)),
        card('Summary', summary)),
    div('columns', card('Spec', spec), card('Device report', reportBox)), extra
  ]);

  const epochAt = x => (job && job.epochs || []).find(e => num(e.epoch) === x);
  hover(lossSvg, readout, x => {
    const e = epochAt(x);
    return e &&
        [
          'epoch ' + e.epoch, 'loss ' + fmtLoss(e.loss),
          e.validation_loss != null && 'validation ' + fmtLoss(e.validation_loss),
          e.validation_accuracy != null && 'accuracy ' + fmtPct(e.validation_accuracy),
          'at ' + fmtSeconds(e.elapsed_seconds),
          e.loss_scale != null && 'loss scale ' + fmtSI(e.loss_scale),
          pos(e.skipped_steps) && e.skipped_steps + ' steps skipped'
        ].filter(Boolean)
            .join(' · ');
  });
  hover(lrSvg, lrReadout, x => {
    const e = epochAt(x);
    return e && 'epoch ' + e.epoch + ' · lr ' + sig(num(e.learning_rate), 4);
  });
  logBox.addEventListener('change', () => {
    logScale = logBox.checked;
    drawEpochs();
  });

  function drawHead() {
    const st = stateName(job.state);
    stateEl.className = 'state state-' + st.toLowerCase();
    fill(stateEl, st);
    fill(
        flags, job.stopped_early && tag('stopped early'),
        job.cancel_requested && isLive() && tag('cancel requested'),
        job.sweep_id &&
            h('a', {href: sweepHref(job.sweep_id), class: 'tag'},
              'sweep ' + job.sweep_id + ' #' + job.sweep_member));
    cancelB.hidden = !isLive();
    cancelB.disabled = !!job.cancel_requested;
    deleteB.hidden = isLive();
    fill(errEl, job.error || '');
    errEl.hidden = !job.error;
    fill(
        notes, job.stop_reason && h('p', {class: 'note', id: 'job-stop-reason'}, job.stop_reason),
        job.checkpoint_error &&
            h('p', {class: 'note warn'}, 'checkpoint not written: ', job.checkpoint_error),
        job.record_damaged && h('p', {class: 'note warn'}, 'record damaged: ', job.record_damaged));
  }
  function drawSummary() {
    const sp = job.spec || {}, done = num(job.epochs_completed) || 0;
    const lv = lastWith(job, 'validation_loss'), la = lastWith(job, 'validation_accuracy');
    fill(summary, dl({id: 'job-summary'}, [
           ['epochs', done + ' / ' + (sp.epochs || 0)],
           ['final loss', done > 0 && fmtLoss(job.final_loss)],
           ['validation loss', lv && fmtLoss(lv.validation_loss) + ' (epoch ' + lv.epoch + ')'],
           [
             'validation accuracy',
             la && fmtPct(la.validation_accuracy) + ' (epoch ' + la.epoch + ')'
           ],
           ['best epoch', pos(job.best_epoch) && String(job.best_epoch)],
           ['model from epoch', pos(job.model_epoch) && String(job.model_epoch)],
           ['device', job.device],
           ['wall time', pos(job.wall_seconds) && fmtSeconds(job.wall_seconds)],
           ['steps', pos(job.steps) && fmtInt(job.steps)],
           ['samples / s', pos(job.samples_per_second) && fmtSI(job.samples_per_second)],
           ['host syncs', fmtInt(job.host_syncs)],
           ['parameters', pos(job.parameter_count) && fmtInt(job.parameter_count)],
           [
             'estimated memory',
             pos(job.estimated_memory_bytes) && fmtBytes(job.estimated_memory_bytes)
           ],
           ['global batch', num(sp.replicas) > 1 && fmtInt(job.global_batch_size)],
           ['owner', job.owner], ['request id', job.request_id],
           ['created', timeEl(job.create_time)],
           ['started', parseTime(job.start_time) && timeEl(job.start_time)],
           ['ended', parseTime(job.end_time) && timeEl(job.end_time)]
         ]));
  }
  function drawEpochs() {
    drawPending = false;
    const eps = job.epochs || [];
    const pts = key => eps.map(e => [num(e.epoch), e[key] == null ? NaN : num(e[key])]);
    const series = [{cls: 'train', pts: pts('loss')}];
    const hasVal = eps.some(e => e.validation_loss != null);
    if (hasVal) series.push({cls: 'validation', pts: pts('validation_loss')});
    valLegend.hidden = !hasVal;
    drawChart(lossSvg, series, {log: logScale, empty: isLive() ? 'no epochs yet' : 'no epochs'});
    drawChart(lrSvg, [{cls: 'lr', pts: pts('learning_rate')}], {height: 110});
    fill(epochsN, String(eps.length));
    drawSummary();
  }
  // Epochs may arrive every few milliseconds: draw at most every 50 ms (a timer rather than
  // requestAnimationFrame, which stops in a window that is not painted).
  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    later(pg, 50, drawEpochs);
  }
  pg.redraw = () => {
    if (job) drawEpochs();
  };

  // A job record replaces ours; epochs are merged (events may be newer than a GetJob reply).
  function setJob(j) {
    const old = job ? job.epochs : [];
    job = Object.assign(job || {}, j, {epochs: []});
    mergeEpochs(job, old);
    mergeEpochs(job, j.epochs);
    drawHead();
    fill(spec, specList(job.spec || {}));
    const r = job.report || {};
    fill(
        reportBox,
        r.verdict &&
            h('p',
              {id: 'job-verdict', class: 'verdict bound-' + String(r.bound || '').toLowerCase()},
              r.verdict),
        reportList(r));
    fill(extra, jobExtras(job));
    drawEpochs();
  }
  const load = async () => setJob(await api('JobService/GetJob', {id}, pg.ctl.signal));
  function onEvent(ev) {
    if (ev.epoch) {
      mergeEpochs(job, [ev.epoch]);
      scheduleDraw();
    }
    if (ev.job) setJob(ev.job);
  }
  // Follows the job until it ends; a stream that breaks off or is refused (too many watches) is
  // followed by GetJob and, after a pause, another try.
  async function follow() {
    while (!pg.stopped && isLive()) {
      let ok = false;
      try {
        await watchJob(id, pg.ctl.signal, onEvent);
        ok = true;
        clearBanner('poll');
      } catch (e) {
        if (pg.stopped || e.silent || e.name === 'AbortError') return;
        report(e, 'poll');
        if (e.code === 'NOT_FOUND') return;
      }
      if (!ok || isLive()) await sleep(pg, ok ? 1000 : 3000);
      try {
        await load();
      } catch (e) {
        if (pg.stopped || e.silent) return;
        report(e, 'poll');
      }
    }
  }
  async function cancel() {
    if (!window.confirm(`Cancel job ${clean(id)}?`)) return;
    cancelB.disabled = true;
    try {
      setJob(await api('JobService/CancelJob', {id}, pg.ctl.signal));
    } catch (e) {
      report(e);
      cancelB.disabled = false;
    }
  }
  async function del() {
    if (!window.confirm(`Delete job ${clean(id)}? Its record, model and checkpoints go.`)) return;
    try {
      await api('JobService/DeleteJob', {id}, pg.ctl.signal);
      location.hash = '#/jobs';
    } catch (e) {
      report(e);
    }
  }

  load().then(
      () => {
        if (isLive()) follow();
      },
      e => {
        report(e);
        if (!pg.stopped && !job) fill(notes, h('p', {class: 'empty'}, 'This job cannot be shown.'));
      });
}

// ---- Sweeps ----

// The sweep's best member: lowest last validation loss, else lowest final loss, among those that
// succeeded or stopped early.
function bestMember(members) {
  const done = members.filter(j => j.state === 'JOB_STATE_SUCCEEDED' || j.stopped_early);
  const val = done.filter(j => Number.isFinite(lastValue(j, 'validation_loss')));
  const pool = val.length ?
      val :
      done.filter(j => pos(j.epochs_completed) && Number.isFinite(num(j.final_loss)));
  const key = val.length ? j => lastValue(j, 'validation_loss') : j => num(j.final_loss);
  return pool.reduce((b, j) => !b || key(j) < key(b) ? j : b, null);
}
const DIFF_LABELS = {
  'optimizer.learning_rate': 'lr',
  'optimizer.momentum': 'momentum',
  'optimizer.weight_decay': 'weight decay',
  'optimizer.kind': 'optimizer',
  batch_size: 'batch size'
};

function sweepPage(pg, view, sweepId) {
  let members = [];
  const cancelB =
      h('button', {
        id: 'sweep-cancel',
        type: 'button',
        class: 'danger',
        hidden: true,
        onclick: () => cancelAll()
      },
        'Cancel sweep');
  const counts = h('span', {id: 'sweep-counts', class: 'muted'}), metric = span();
  const chart = s('svg', {id: 'sweep-chart', class: 'chart', role: 'img', 'aria-label': 'Members'});
  const thead = h('thead'), tbody = h('tbody');
  add(view, [
    div('page-head', h('h1', null, span('muted', 'Sweep '), span('mono', sweepId)), counts,
        span('spacer'), cancelB),
    card(
        null,
        div('chart-head', h('h2', null, metric),
            span('muted', 'per epoch; the best member highlighted')),
        chart),
    card('Members', div('scroll', h('table', {id: 'sweep-members', class: 'grid'}, thead, tbody)))
  ]);

  // Hovering a member's row highlights its line.
  const highlight = (jobId, on) => {
    for (const p of chart.querySelectorAll('path[data-job-id]')) {
      if (p.getAttribute('data-job-id') === jobId) p.classList.toggle('hover', on);
    }
  };
  function memberRow(j, flat, diff, best) {
    const spec = j.spec || {}, la = lastWith(j, 'validation_accuracy');
    return h(
        'tr', {
          'data-job-id': j.id,
          class: j === best && 'best',
          onmouseenter: () => highlight(j.id, true),
          onmouseleave: () => highlight(j.id, false)
        },
        td('num', String(j.sweep_member)),
        td(null, jobLink(j.id), j === best && tag('best', 'tag-best')), td(null, badge(j.state)),
        diff.map(k => td('mono', flat[k] == null ? '—' : valueText(flat[k]))),
        td('num', (j.epochs_completed || 0) + ' / ' + (spec.epochs || 0)),
        h('td', {class: 'reason', title: j.stop_reason || ''},
          j.stopped_early ? j.stop_reason || 'early' : '—'),
        td('num', pos(j.epochs_completed) ? fmtLoss(j.final_loss) : '—'),
        td('num', fmtLoss((lastWith(j, 'validation_loss') || {}).validation_loss)),
        td('num', la ? fmtPct(la.validation_accuracy) : '—'));
  }
  function draw() {
    const best = bestMember(members), flats = members.map(j => flatten(j.spec || {})), keys = [];
    for (const f of flats)
      for (const k of Object.keys(f))
        if (!keys.includes(k)) keys.push(k);
    // The spec fields whose values differ between members.
    const diff = keys.filter(k => new Set(flats.map(f => String(f[k]))).size > 1);
    fill(
        thead,
        h('tr', null,
          ['#', 'Id', 'State']
              .concat(
                  diff.map(k => DIFF_LABELS[k] || k),
                  ['Epochs', 'Stopped', 'Final loss', 'Validation loss', 'Accuracy'])
              .map(t => h('th', null, t))));
    fill(
        tbody,
        members.length ? members.map((j, i) => memberRow(j, flats[i], diff, best)) :
                         emptyRow(8, 'No jobs in this sweep.'));
    const key = members.some(j => lastWith(j, 'validation_loss')) ? 'validation_loss' : 'loss';
    fill(metric, key === 'loss' ? 'Training loss' : 'Validation loss');
    // The best member's line is drawn last, over the others.
    const order = members.filter(j => j !== best).concat(best ? [best] : []);
    drawChart(
        chart,
        order.map(
            j => ({
              cls: 'member c' + (members.indexOf(j) % 8) + (j === best ? ' best' : ''),
              attrs: {'data-job-id': j.id},
              title: '#' + j.sweep_member + ' ' + j.id,
              pts: (j.epochs || []).map(e => [num(e.epoch), e[key] == null ? NaN : num(e[key])])
            })),
        {height: 260, empty: 'no epochs yet'});
    const by = {};
    for (const j of members) {
      const st = stateName(j.state).toLowerCase();
      by[st] = (by[st] || 0) + 1;
    }
    fill(
        counts,
        members.length + ' members: ' + Object.keys(by).map(k => by[k] + ' ' + k).join(', '));
    cancelB.hidden = !members.some(j => !isEnded(j.state));
  }
  pg.redraw = draw;
  const load = async () => {
    let all = [], pageToken = '';
    do {
      const res = await api(
          'JobService/ListJobs',
          {sweep_id: sweepId, page_size: 1000, view: 'JOB_VIEW_FULL', page_token: pageToken},
          pg.ctl.signal);
      all = all.concat(res.jobs || []);
      pageToken = res.next_page_token || '';
    } while (pageToken);
    members = all.sort((a, b) => num(a.sweep_member) - num(b.sweep_member));
    draw();
    return members.some(j => !isEnded(j.state));  // refreshed while a member has not ended
  };
  async function cancelAll() {
    const live = members.filter(j => !isEnded(j.state));
    if (!live.length ||
        !window.confirm(
            `Cancel the ${live.length} members of sweep ${clean(sweepId)} that have not ended?`))
      return;
    cancelB.disabled = true;
    let failed = null;
    for (const j of live) {
      try {
        await api('JobService/CancelJob', {id: j.id}, pg.ctl.signal);
      } catch (e) {
        if (e.silent || e.name === 'AbortError') return;
        if (e.code !== 'FAILED_PRECONDITION') failed = failed || e;  // one that ended meanwhile
      }
    }
    cancelB.disabled = false;
    if (failed) report(failed);
    refresh(load);  // the poll goes on while members have not ended
  }
  poll(pg, 3000, load);
}

// ---- Datasets ----

function datasetRow(d, remove) {
  const loc = d.location && !/UNSPECIFIED/.test(d.location) ? enumText(d.location) : '';
  const shape = v => (v || []).join('×');
  return h(
      'tr', {'data-dataset': d.name}, td('mono', d.name), td(null, d.owner || '—'),
      td('num', fmtInt(d.row_count)), td('mono', shape(d.feature_shape)),
      td(null,
         (shape(d.target_shape) ? shape(d.target_shape) + ' ' : '') +
             enumText(d.target_dtype || ''),
         d.target_dtype === 'DTYPE_INT64' &&
             span('muted', ` classes ${d.target_min}–${d.target_max}`)),
      h('td', {class: 'num', title: fmtInt(d.size_bytes) + ' bytes'}, fmtBytes(d.size_bytes)),
      td(null, d.device), td(null, loc ? tag(loc, 'loc-' + loc) : '—'),
      td(null, d.shared ? 'shared' : '—', d.peer_copy && tag('peer copy')),
      td(null, timeEl(d.create_time)), td(null, timeEl(d.last_use_time)),
      h('td', {class: 'mono', title: d.sha256 || ''}, (d.sha256 || '').slice(0, 12)),
      td(null,
         h('button',
           {type: 'button', class: 'danger small dataset-delete', onclick: () => remove(d.name)},
           'Delete')));
}

function datasetsPage(pg, view) {
  const count = span('muted');
  const refreshB = h('button', {id: 'datasets-refresh', type: 'button'}, 'Refresh');
  const tbl = table(
      {id: 'datasets-table'},
      [
        'Name', 'Owner', 'Rows', 'Features', 'Targets', 'Size', 'Device', 'Where', 'Shared',
        'Created', 'Last used', 'SHA-256', ''
      ],
      []);
  add(view, [
    div('page-head', h('h1', null, 'Datasets'), count, span('spacer'), refreshB), div('scroll', tbl)
  ]);
  const load = async () => {
    let all = [], pageToken = '';
    do {  // ListDatasets answers in one page today; a token is followed if one comes
      const res = await api(
          'DatasetService/ListDatasets', pageToken ? {page_token: pageToken} : {}, pg.ctl.signal);
      all = all.concat(res.datasets || []);
      pageToken = res.next_page_token || '';
    } while (pageToken);
    fill(
        tbl.tBodies[0],
        all.length ? all.map(d => datasetRow(d, remove)) : emptyRow(12, 'No datasets.'));
    fill(count, all.length + (all.length === 1 ? ' dataset' : ' datasets'));
  };
  async function remove(name) {
    if (!window.confirm(`Delete dataset "${clean(name)}"? Its file and memory are freed.`)) return;
    try {
      await api('DatasetService/DeleteDataset', {name}, pg.ctl.signal);
    } catch (e) {
      report(e);
    }
    refresh(load);
  }
  refreshB.addEventListener('click', () => refresh(load));
  poll(pg, 10000, load);
}

// ---- Devices ----

// Diagnose's figures for one device (the peak a job's speed is compared with), or null.
function diagnosis(g) {
  if (!g) return null;
  return dl({class: 'kv device-diagnosis'}, [
    ['matmul peak', `${fmtSI(g.matmul_flops_per_second, 'FLOP/s')} (n = ${g.matmul_size})`],
    ['host to device', fmtSI(g.host_to_device_bytes_per_second, 'B/s')],
    ['launch', fmtSeconds(g.launch_seconds)], ['sync', fmtSeconds(g.sync_seconds)],
    [
      'utilization during matmul',
      g.utilization_during_matmul != null && fmtPct(g.utilization_during_matmul)
    ]
  ]);
}

function deviceCard(d, g) {
  const u = d.utilization == null ? NaN : num(d.utilization);
  const used = num(d.memory_used_bytes), total = num(d.memory_total_bytes);
  const running = d.running_jobs || [], sets = d.datasets || [];
  return h(
      'section',
      {class: 'card device-card' + (d.unusable_reason ? ' unusable' : ''), 'data-device': d.device},
      h('header', {class: 'device-head'}, h('strong', {class: 'mono'}, d.device),
        span('device-name', d.name), d.is_default && tag('default')),
      d.unusable_reason && h('p', {class: 'note warn'}, 'unusable: ', d.unusable_reason),
      div('metric', span('label', 'utilization'), meter(u),
          span('value device-util', Number.isFinite(u) ? fmtPct(u) : 'n/a')),
      div('metric', span('label', 'memory'), meter(total > 0 ? used / total : NaN),
          span('value device-memory', fmtBytes(used) + ' / ' + fmtBytes(total))),
      dl(null,
         [
           [
             'running',
             running.length ?
                 running.map(
                     (j, i) => [i ? ', ' : '', /^job-[0-9a-f]+$/.test(j) ? jobLink(j) : j]) :
                 'none'
           ],
           ['queued', String(d.queued_jobs || 0)],
           [
             'datasets',
             sets.length ? `${sets.length} (${fmtBytes(d.dataset_bytes)}): ${sets.join(', ')}` :
                           'none'
           ],
           ['peer ranks', (d.peer_ranks || []).join(', ')], ['uuid', d.uuid]
         ]),
      diagnosis(g));
}

function devicesPage(pg, view) {
  const list = h('div', {id: 'devices-list', class: 'cards'});
  const measured = span('muted', '');
  add(view, [div('page-head', h('h1', null, 'Devices'), measured), list]);
  // Diagnose's figures once per visit: its cached measurement (it measures only when it has
  // none, and each caller may run few at once); the devices themselves every 2 s.
  let diag = {};
  api('SystemService/Diagnose', {}, pg.ctl.signal)
      .then(r => {
        for (const g of r.devices || []) diag[g.device] = g;
        fill(measured, r.measure_time ? ['diagnosed ', timeEl(r.measure_time)] : '');
      })
      .catch(e => {
        if (!pg.stopped && !e.silent) report(e, 'poll');
      });
  poll(pg, 2000, async () => {
    const devs = (await api('SystemService/ListDevices', {}, pg.ctl.signal)).devices || [];
    fill(
        list,
        devs.length ? devs.map(d => deviceCard(d, diag[d.device])) :
                      h('p', {class: 'empty'}, 'No devices.'));
  });
}

// ---- Start ----

document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', logIn);
  $('logout').addEventListener('click', logOut);
  $('error-banner').addEventListener('click', () => clearBanner());
  window.addEventListener('hashchange', route);
  window.addEventListener('pagehide', stopPage);  // ends the watch stream when the user leaves
  window.addEventListener('pageshow', ev => {
    if (ev.persisted) route();
  });                // from the page cache
  let resizing = 0;  // charts are drawn at their width in pixels
  window.addEventListener('resize', () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => {
      if (page && page.redraw) page.redraw();
    }, 150);
  });
  start();
});
})();
