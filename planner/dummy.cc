namespace strata::planner {}
