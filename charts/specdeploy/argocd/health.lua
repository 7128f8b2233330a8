-- Argo CD resource health for specdeploy.io/SpeculativeDeployment (argocd-cm key
-- resource.customizations.health.specdeploy.io_SpeculativeDeployment; docs/gitops.md).
--
-- The status is trusted only once it describes the applied spec (observedGeneration = generation);
-- then status.phase decides, and the conditions say why:
--   Speculating, Serving, Measuring (with Ready True)  -> Healthy
--   Deploying, Pending, Measuring (Ready not True)     -> Progressing
--   RollingBack, RolledBack, Rejected, Degraded        -> Degraded
-- RolledBack is Degraded although the pods still serve: what Git asked for (speculation) is not running.
-- RollingBack (decided; speculative pods still run with speculation until the rollout replaces them) is
-- Degraded too: the decision stands, only the rollout is still under way.

local function find_condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, condition in ipairs(status.conditions) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

-- "Reason: message" of a condition, or nil when it is absent.
local function describe(condition)
  if condition == nil then
    return nil
  end
  local reason = condition.reason or condition.status or ""
  if condition.message ~= nil and condition.message ~= "" then
    return reason .. ": " .. condition.message
  end
  return reason
end

-- The first condition among `kinds` whose status is not True, described; nil when all are True.
local function first_problem(status, kinds)
  for _, kind in ipairs(kinds) do
    local condition = find_condition(status, kind)
    if condition ~= nil and condition.status ~= "True" then
      return describe(condition)
    end
  end
  return nil
end

local function health(sd)
  local status = sd.status
  if status == nil then
    return "Progressing", "Waiting for the specdeploy operator to reconcile this SpeculativeDeployment"
  end
  local generation = sd.metadata and sd.metadata.generation
  local observed = status.observedGeneration
  if generation ~= nil and (observed == nil or observed < generation) then
    return "Progressing", "Waiting for the operator to observe generation " .. tostring(generation)
      .. " (status describes " .. (observed == nil and "none" or tostring(observed)) .. ")"
  end

  local phase = status.phase
  local ready = find_condition(status, "Ready")
  local ready_true = ready ~= nil and ready.status == "True"

  if phase == "Rejected" then
    return "Degraded", "Rejected: " .. (first_problem(status, {"MemoryFits", "Compatible"})
      or describe(ready) or "the spec cannot run")
  end
  if phase == "RolledBack" then
    return "Degraded", "Speculation rolled back: " .. (describe(find_condition(status, "RolledBack"))
      or "see status.speculation.lastRollback")
  end
  if phase == "RollingBack" then
    return "Degraded", "Speculation rolling back: " .. (describe(find_condition(status, "RolledBack"))
      or "see status.speculation.lastRollback")
  end
  if phase == "Degraded" then
    return "Degraded", describe(ready) or "Pods were lost"
  end
  if phase == "Speculating" or phase == "Serving" then
    return "Healthy", describe(find_condition(status, "SpeculationHealthy")) or describe(ready) or phase
  end
  if phase == "Measuring" then
    if ready_true then
      return "Healthy", "Measuring: " .. (describe(find_condition(status, "SpeculationHealthy")) or "waiting for samples")
    end
    return "Progressing", describe(ready) or "Measuring"
  end
  if phase == nil or phase == "Pending" or phase == "Deploying" then
    return "Progressing", describe(ready) or "Deploying"
  end
  return "Unknown", "Unknown phase " .. tostring(phase)
end

local hs = {}
hs.status, hs.message = health(obj)
return hs
