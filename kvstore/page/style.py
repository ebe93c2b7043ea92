"""The page's inline CSS and the live page's inline refresh script (no external fonts, scripts or images).

Contract: CSS (one stylesheet, light and dark via prefers-color-scheme) and `refresh_script(seconds)`. The
script fetches the page's own URL with `fragment=1` and swaps the `<main id="kv-main">` content, so the page
keeps its scroll position, pauses while the tab is hidden, and says so when the server cannot be reached.
"""
from __future__ import annotations

CSS = """
:root{--bg:#f6f7f9;--card:#fff;--ink:#1c2330;--mute:#667085;--line:#e4e7ec;--grid:#eef0f3;
--eval:#f08c2e;--rest:#2f80ed;--reuse:#27ae60;--slot:#27ae60;--restored:#2f80ed;--parent:#8e5bd6;
--prefix:#17a2b8;--miss:#e5484d;--track:#eef0f3;--logical:#98a2b3;--unique:#7f9cf5;--stored:#2f80ed;
--ok:#1a7f37;--okbg:#dcfce7;--warn:#9a6700;--warnbg:#fff3c4;--busy:#1d4ed8;--busybg:#dbeafe}
@media (prefers-color-scheme:dark){:root{--bg:#0f131a;--card:#171c25;--ink:#e6e9ef;--mute:#98a2b3;
--line:#2a3140;--grid:#222937;--track:#222937;--okbg:#12351f;--ok:#6ee7a0;--warnbg:#3b2f0b;--warn:#f5cf5b;
--busybg:#172a52;--busy:#93b4ff}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
header{max-width:1240px;margin:0 auto;display:flex;flex-wrap:wrap;align-items:baseline;gap:.4rem 1rem;padding:1.1rem 1.5rem .4rem}
header h1{font-size:1.35rem;margin:0;letter-spacing:-.01em}
header .sub{color:var(--mute)}
#kv-status{margin-left:auto;font-size:.8rem;padding:.15rem .6rem;border-radius:999px;background:var(--track);color:var(--mute)}
#kv-status.live{background:var(--okbg);color:var(--ok)}#kv-status.stale{background:var(--warnbg);color:var(--warn)}
main{padding:.5rem 1.5rem 2rem;max-width:1240px;margin:0 auto}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:1rem 1.2rem;margin:1rem 0}
section h2{font-size:1.05rem;margin:0 0 .2rem}
section h3{font-size:.9rem;margin:1.1rem 0 .4rem;color:var(--mute);font-weight:600;text-transform:uppercase;letter-spacing:.04em}
.note{color:var(--mute);margin:.1rem 0 .6rem;font-size:.88rem}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(160px,1fr));gap:.8rem;margin-top:.6rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:.7rem .9rem}
.card b{display:block;font-size:1.45rem;font-variant-numeric:tabular-nums;letter-spacing:-.01em}
.card span{color:var(--mute);font-size:.82rem}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:left;padding:.38rem .6rem;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:.78rem;color:var(--mute);font-weight:600;text-transform:uppercase;letter-spacing:.03em}
td.n,th.n{text-align:right}tr:last-child td{border-bottom:0}
.ns{color:var(--mute)}.ns::after{content:" /";}.name{font-weight:600;word-break:break-all}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.85em}
.badge{display:inline-block;font-size:.75rem;padding:.05rem .5rem;border-radius:999px;background:var(--track);color:var(--mute)}
.badge.busy{background:var(--busybg);color:var(--busy)}.badge.ok{background:var(--okbg);color:var(--ok)}
.badge.dirty{background:var(--warnbg);color:var(--warn)}
.fig{margin:.3rem 0 .8rem}.chart{width:100%;height:auto;display:block}
.chart .grid{stroke:var(--grid)}.chart .axis{stroke:var(--line)}
.chart text{fill:var(--mute);font-size:11px}.chart .lab{fill:var(--ink);font-size:12px}.chart .val{fill:var(--ink);font-size:12px}
.chart .col:hover rect{opacity:.8}.chart .track{fill:var(--track)}
.legend{display:flex;flex-wrap:wrap;gap:.3rem 1rem;font-size:.82rem;color:var(--mute)}
.sw{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;margin-right:.35rem;vertical-align:-1px}
.c-eval{fill:var(--eval);background:var(--eval)}.c-rest{fill:var(--rest);background:var(--rest)}
.c-reuse{fill:var(--reuse);background:var(--reuse)}.k-slot{fill:var(--slot);background:var(--slot)}
.k-restored{fill:var(--restored);background:var(--restored)}.k-parent{fill:var(--parent);background:var(--parent)}
.k-prefix{fill:var(--prefix);background:var(--prefix)}.k-miss{fill:var(--miss);background:var(--miss)}
.b-logical{fill:var(--logical)}.b-unique{fill:var(--unique)}.b-stored{fill:var(--stored)}
.e-cap{fill:var(--eval);background:var(--eval)}.e-ttl{fill:var(--logical);background:var(--logical)}
.e-quota{fill:var(--parent);background:var(--parent)}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:0 1.5rem}
ul.tree,ul.tree ul{list-style:none;margin:0;padding-left:1.3rem}
ul.tree{padding-left:.2rem}
ul.tree li{position:relative;padding:.18rem 0 .18rem .9rem}
ul.tree ul li::before{content:"";position:absolute;left:-.5rem;top:0;height:1.05rem;width:1rem;
border-left:2px solid var(--line);border-bottom:2px solid var(--line);border-bottom-left-radius:6px}
ul.tree ul li:not(:last-child)::after{content:"";position:absolute;left:-.5rem;top:1rem;bottom:0;border-left:2px solid var(--line)}
.node{display:inline-flex;gap:.5rem;align-items:baseline;padding:.1rem .55rem;border:1px solid var(--line);border-radius:6px;background:var(--bg)}
.node small{color:var(--mute)}.node.gone{border-style:dashed;color:var(--mute)}
.empty{color:var(--mute);font-style:italic;padding:.4rem 0}
.alert{background:var(--warnbg);color:var(--warn);border-radius:6px;padding:.5rem .8rem;margin:.4rem 0 .8rem}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1rem;margin:.4rem 0}
dl.kv dt{color:var(--mute)}dl.kv dd{margin:0;word-break:break-all}
footer{color:var(--mute);font-size:.8rem;padding:0 1.5rem 1.5rem;max-width:1240px;margin:0 auto}
.chart.bars{max-width:820px}
table.narrow{max-width:640px}td.mute{color:var(--mute)}
.namespace h3{text-transform:none;letter-spacing:0;font-size:.95rem;color:var(--ink)}
.namespace h3 small{color:var(--mute);font-weight:400}
"""


def refresh_script(seconds: float) -> str:
    ms = max(1000, int(seconds * 1000))
    return ("(function(){var main=document.getElementById('kv-main'),st=document.getElementById('kv-status'),"
            "busy=false;function tick(){if(document.hidden||busy)return;busy=true;"
            "var u=new URL(location.href);u.searchParams.set('fragment','1');"
            "fetch(u,{cache:'no-store',credentials:'same-origin'}).then(function(r){"
            "if(!r.ok)throw new Error('HTTP '+r.status);return r.text();}).then(function(t){main.innerHTML=t;"
            "st.textContent='live';st.className='live';}).catch(function(e){"
            "st.textContent='not updating: '+e.message;st.className='stale';}).then(function(){busy=false;});}"
            f"setInterval(tick,{ms});document.addEventListener('visibilitychange',tick);}})();")
