-- Leaves what a closing worker remembers of one job (a hand-off, an orphan
-- it left, a run it saw end) with a worker that stays, as a `keep` entry in
-- that worker's inbox: once read, the job is remembered by a live process
-- again, which gives it back (or makes its end stand) after a loss of
-- Redis's data (see custody.rs).
-- KEYS: base, 9 the receiving worker's inbox, 10 cleanup hash
-- ARGV: base, 4 receiving worker, 5 encoded entry, 6 maxlen
-- Returns {entry id, identity} where identity is "<run id> <generation>"
-- (a later `entrusted_left` with another identity means Redis may have
-- lost the entry unread), or {} when the worker is not active (gone, being
-- cleaned up, drained, or not registered again yet after a loss).
if not worker_active(ARGV[4], KEYS[10]) then
  return {}
end
local id = stream_add(KEYS[9], 'keep', ARGV[5], tonumber(ARGV[6]))
return {id, (server_run_id() or '') .. ' ' .. data_generation()}
