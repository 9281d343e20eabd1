// The BullMQ side of `bench --peer bullmq`: the same workload as Flotilla's
// dispatch section, against the same Redis, printed as one JSON line.
//
// node peer.mjs <redis-url> <jobs> <concurrency> <latency-samples>
//
// Throughput: <jobs> no-op jobs added with <concurrency> adds in flight while
// one Worker (concurrency <concurrency>) processes them; timed from the first
// add to the last processor start. Latency: one job at a time, add → the
// processor starts it. Commands: INFO commandstats delta over the throughput
// run (incl. commands inside BullMQ's scripts), per job, once every job has
// completed. CPU: Redis's (INFO cpu) and this process's, per job, over the
// same run.
import { Queue, Worker } from 'bullmq';

const [url, jobsArg, concurrencyArg, samplesArg] = process.argv.slice(2);
const jobs = Number(jobsArg ?? 20000);
const concurrency = Number(concurrencyArg ?? 100);
const samples = Number(samplesArg ?? 1000);

const parsed = new URL(url ?? 'redis://127.0.0.1:6379');
const connection = {
  host: parsed.hostname,
  port: Number(parsed.port || 6379),
  username: parsed.username ? decodeURIComponent(parsed.username) : undefined,
  password: parsed.password ? decodeURIComponent(parsed.password) : undefined,
  db: parsed.pathname.length > 1 ? Number(parsed.pathname.slice(1)) : 0,
  maxRetriesPerRequest: null,
};

function quantile(sorted, q) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1);
  return sorted[Math.max(0, i)];
}

async function commandCalls(client) {
  const info = await client.info('commandstats');
  const calls = {};
  for (const line of info.split('\n')) {
    const m = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim());
    if (m && m[1] !== 'info') calls[m[1]] = Number(m[2]);
  }
  return calls;
}

function delta(before, after) {
  const out = {};
  for (const [name, calls] of Object.entries(after)) {
    const d = calls - (before[name] ?? 0);
    if (d > 0) out[name] = d;
  }
  return out;
}

const run = `flbench-${process.pid}-${Date.now()}`;

// Throughput.
const tpQueue = new Queue(`${run}-tp`, { connection });
const client = await tpQueue.client;
let started = 0;
let completed = 0;
let lastStart = 0n;
let allStarted;
const allStartedP = new Promise((resolve) => (allStarted = resolve));
let allCompleted;
const allCompletedP = new Promise((resolve) => (allCompleted = resolve));
const tpWorker = new Worker(
  `${run}-tp`,
  async () => {
    started += 1;
    if (started === jobs) {
      lastStart = process.hrtime.bigint();
      allStarted();
    }
  },
  { connection, concurrency, autorun: false },
);
tpWorker.on('completed', () => {
  completed += 1;
  if (completed === jobs) allCompleted();
});
tpWorker.run();
await tpWorker.waitUntilReady();
async function redisCpuSeconds(client) {
  const info = await client.info('cpu');
  let total = 0;
  for (const line of info.split('\n')) {
    const m = /^used_cpu_(user|sys):([0-9.]+)/.exec(line.trim());
    if (m) total += Number(m[2]);
  }
  return total;
}

const before = await commandCalls(client);
const redisCpuBefore = await redisCpuSeconds(client);
const cpuBefore = process.cpuUsage();
const t0 = process.hrtime.bigint();
let next = 0;
async function adder() {
  while (next < jobs) {
    const i = next++;
    await tpQueue.add('job', { i });
  }
}
await Promise.all(Array.from({ length: concurrency }, adder));
await allStartedP;
const elapsedS = Number(lastStart - t0) / 1e9;
await allCompletedP;
const cpu = process.cpuUsage(cpuBefore);
const redisCpuS = (await redisCpuSeconds(client)) - redisCpuBefore;
const commands = delta(before, await commandCalls(client));
const totalCommands = Object.values(commands).reduce((a, b) => a + b, 0);
await tpWorker.close();

// Latency: one job at a time.
const latQueue = new Queue(`${run}-lat`, { connection });
const waiting = new Map();
const latWorker = new Worker(
  `${run}-lat`,
  async (job) => {
    const at = process.hrtime.bigint();
    const resolve = waiting.get(job.data.i);
    if (resolve) resolve(at);
  },
  { connection, concurrency },
);
await latWorker.waitUntilReady();
const lat = [];
for (let i = 0; i < samples; i++) {
  const startedP = new Promise((resolve) => waiting.set(i, resolve));
  const t = process.hrtime.bigint();
  await latQueue.add('lat', { i });
  const at = await startedP;
  waiting.delete(i);
  lat.push(Number(at - t) / 1e6);
}
lat.sort((a, b) => a - b);
await latWorker.close();

await tpQueue.obliterate({ force: true });
await latQueue.obliterate({ force: true });
await tpQueue.close();
await latQueue.close();

const top = Object.entries(commands)
  .sort((a, b) => b[1] - a[1])
  .slice(0, 6)
  .map(([name, calls]) => `${name} ${(calls / jobs).toFixed(2)}`)
  .join(', ');
console.log(
  JSON.stringify({
    jobs,
    concurrency,
    elapsed_s: elapsedS,
    throughput: jobs / elapsedS,
    latency_samples: samples,
    latency_p50_ms: quantile(lat, 0.5),
    latency_p99_ms: quantile(lat, 0.99),
    commands_per_job: totalCommands / jobs,
    redis_cpu_us_per_job: (redisCpuS * 1e6) / jobs,
    client_cpu_us_per_job: (cpu.user + cpu.system) / jobs,
    commands_breakdown: top,
  }),
);
process.exit(0);
