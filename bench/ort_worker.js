// ONNX Runtime's CPU provider as a benchmark anchor for bench/compare_models.py
// (never a dependency of Backplane): reads "load NAME PATH INPUT DTYPE d0,d1,..",
// "time NAME COUNT" and "quit" lines on stdin, answers one JSON line each.
// Needs onnxruntime-node on NODE_PATH (npm install --ignore-scripts onnxruntime-node).
const ort = require('onnxruntime-node');
const readline = require('readline');

const threads = parseInt(process.env.ORT_THREADS || '2', 10);
const sessions = {};

function fill(dtype, dims) {
  const n = dims.reduce((a, b) => a * b, 1);
  if (dtype === 'int64') return new ort.Tensor('int64', new BigInt64Array(n).fill(1n), dims);
  const a = new Float32Array(n);
  let s = 1;
  for (let i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; a[i] = s / 1073741824 - 1; }
  return new ort.Tensor('float32', a, dims);
}

const rl = readline.createInterface({input: process.stdin});
rl.on('line', async (line) => {
  rl.pause();
  const w = line.trim().split(' ');
  try {
    if (w[0] === 'load') {
      const [, name, path, input, dtype, dims] = w;
      const session = await ort.InferenceSession.create(path, {
        intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
        executionMode: 'sequential'});
      sessions[name] = {session, feeds: {[input]: fill(dtype, dims.split(',').map(Number))}};
      await session.run(sessions[name].feeds);  // warm
      console.log(JSON.stringify({ok: true}));
    } else if (w[0] === 'time') {
      const s = sessions[w[1]];
      const times = [];
      for (let i = 0; i < parseInt(w[2], 10); i++) {
        const t0 = process.hrtime.bigint();
        await s.session.run(s.feeds);
        times.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
      console.log(JSON.stringify({times}));
    } else if (w[0] === 'quit') {
      process.exit(0);
    }
  } catch (e) {
    console.log(JSON.stringify({error: String(e)}));
  }
  rl.resume();
});
