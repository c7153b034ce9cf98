"""loops"""
